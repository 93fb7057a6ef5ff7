"""Shared fixtures for the data-bin format tests."""
import pathlib

import pytest

FAIRSEQ_DIR = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "fairseq-0.12-data-bin"


@pytest.fixture(scope="session")
def fairseq_dir() -> pathlib.Path:
    """train.txt/valid.txt and what fairseq 0.12.2 made of them with
    ``fairseq-preprocess --only-source --trainpref train.txt --validpref valid.txt --destdir data-bin --workers 1``.
    """
    return FAIRSEQ_DIR
