"""The fairseq-preprocess command line a language-model user types (fairseq's LM example:
--only-source --trainpref --validpref --destdir --workers --dataset-impl mmap; see
fairseq_cli/preprocess.py and fairseq/options.py add_preprocess_args in 0.12.2) works with
shard-preprocess and writes fairseq's files; a dataset format we do not write is refused."""
import pytest

from shardtrain.cli.preprocess import main

from st_testutils import cli_refusal

TESTS_ROOM = "shardtrain.data"  # it drives the commands: its imports cannot say which room it tests

FAIRSEQ_FILES = ["dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx"]


def _argv(fairseq_dir, out, *extra):
    return ["--only-source", "--trainpref", str(fairseq_dir / "train.txt"), "--validpref",
            str(fairseq_dir / "valid.txt"), "--destdir", str(out), "--tokenizer", "space", "--no-progress-bar",
            *extra]


@pytest.mark.slow
def test_fairseq_lm_command_line_writes_fairseqs_files(tmp_path, fairseq_dir):
    out = tmp_path / "data-bin"
    main(_argv(fairseq_dir, out, "--workers", "2", "--dataset-impl", "mmap"))
    for name in FAIRSEQ_FILES:
        assert (out / name).read_bytes() == (fairseq_dir / name).read_bytes(), name


def test_srcdict_from_fairseq_keeps_the_ids(tmp_path, fairseq_dir):
    out = tmp_path / "data-bin"
    main(_argv(fairseq_dir, out, "--srcdict", str(fairseq_dir / "dict.txt")))
    for name in FAIRSEQ_FILES:
        assert (out / name).read_bytes() == (fairseq_dir / name).read_bytes(), name


@pytest.mark.parametrize("impl", ["lazy", "cached", "raw"])
def test_other_dataset_impls_are_refused(tmp_path, fairseq_dir, capsys, impl):
    _, err = cli_refusal(main, _argv(fairseq_dir, tmp_path / "out", "--dataset-impl", impl), capsys)
    assert f"--dataset-impl {impl}" in err and "mmap" in err
    assert not (tmp_path / "out").exists()
