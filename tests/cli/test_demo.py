"""shard-demo end to end, shrunk: stdlib corpus, preprocess, train, resume, validate, sample."""
import os

from shardtrain.cli import demo


def test_demo_runs_on_a_small_stdlib_corpus(tmp_path, capsys):
    work = str(tmp_path / "demo")
    demo.main(["--workdir", work, "--corpus-mb", "0.3", "--max-update", "8", "--log-format", "simple"])
    out = capsys.readouterr().out
    assert "resuming from" in out and "loaded checkpoint" in out  # the second half resumed
    assert "\nH\tdef " in out  # a sample continuing the prompt
    assert os.path.exists(os.path.join(work, "data-bin", "spm.model"))
    assert os.path.exists(os.path.join(work, "checkpoints", "checkpoint_last.pt"))
    with open(os.path.join(work, "corpus.train.txt")) as f:
        assert "import" in f.read()  # built from the standard library's Python source
