"""shard-demo end to end, shrunk: stdlib corpus, preprocess, train, resume, validate, sample."""
import os

from shardtrain.cli import demo


def test_demo_runs_on_a_small_stdlib_corpus(tmp_path, capfd):
    work = str(tmp_path / "demo")
    demo.main(["--workdir", work, "--corpus-mb", "0.3", "--max-update", "8", "--log-format", "simple"])
    out = capfd.readouterr().out  # capfd: the training ranks are child processes
    assert "resuming from" in out and "loaded checkpoint" in out  # the second half resumed
    assert "fully_sharded: materialised" in out and "mesh (2,)" in out  # on 2 ranks
    assert "\nH\tdef " in out  # a sample continuing the prompt
    assert os.path.exists(os.path.join(work, "data-bin", "spm.model"))
    last = os.path.join(work, "checkpoints", "checkpoint_last")  # sharded: a directory, written by both ranks
    assert os.path.isdir(last) and os.path.exists(os.path.join(last, "COMPLETE"))
    with open(os.path.join(work, "corpus.train.txt")) as f:
        assert "import" in f.read()  # built from the standard library's Python source
