"""A text whose lines are all longer than sentencepiece's maximum is refused naming that
maximum, not "check that the file holds text" (red-team item 10 of issue 16)."""
import pytest

from shardtrain.core.errors import ConfigError
from shardtrain.data.tokenizers import train_sentencepiece


def test_lines_over_the_maximum_length_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"1 of the 1 lines of the --trainpref file are longer than 4,192 bytes"):
        train_sentencepiece(["word " * 2_000_000], str(tmp_path / "spm.model"), 100)  # one 10 MB line
    assert not (tmp_path / "spm.model").exists()
