"""shard-demo end to end, shrunk: stdlib corpus, preprocess, train, resume, validate, sample."""
import os
import re
import signal

import pytest
import torch

from shardtrain.cli import demo
from shardtrain.trainer.launch.preemption import PreemptionWatcher


@pytest.mark.slow
def test_demo_runs_on_a_small_stdlib_corpus(tmp_path, capfd):
    work = str(tmp_path / "demo")
    # The smallest demo it accepts: MIN_CORPUS_MB of source, one update before the stop and one after it.
    demo.main(["--workdir", work, "--corpus-mb", str(demo.MIN_CORPUS_MB), "--max-update", "2", "--log-format",
               "simple"])
    out = capfd.readouterr().out  # capfd: the training ranks are child processes
    assert "resuming from" in out and "loaded checkpoint" in out  # the second half resumed
    # every step that can take seconds says what it does and how long it took
    for said in (r"training a bpe sentencepiece model of \d+ pieces on .*: done in [\d.]+ s",
                 r"started 2 ranks \(gloo\) in [\d.]+ s", r"loaded checkpoint .* updates\) in [\d.]+ s",
                 r"== shard-demo: \(\d+ s\)"):
        assert re.search(said, out), said
    assert out.count("settings (not the defaults):") == 2 and "\ncommon:\n" not in out  # compact config
    assert "fully_sharded: materialised" in out and "mesh (2,)" in out  # on 2 ranks
    after = out.split(f"after {demo.SAMPLE_PROMPT!r}")[1].split("\n")[1:]
    sample = [line for line in after if not re.match(r"\d{4}-\d\d-\d\d ", line)][:demo.SAMPLE_LINES]  # no log lines
    assert sample[0].startswith(demo.SAMPLE_PROMPT) and "== shard-demo" not in "".join(sample), out[-2000:]
    with open(os.path.join(work, "curves.svg")) as f:  # the curves of both phases, drawn from the log file
        curves = f.read()
    for tag in ("train_inner", "valid"):
        assert f'data-tag="{tag}" data-metric="loss"' in curves
    # where the time went: every phase's share of the wall time, in the order they ran
    assert re.search(r"== shard-demo: done in (\d+ min )?\d+ s \(preprocess \d+%, train \d+%, resume \d+%, "
                     r"validate \d+%, sample \d+%, plot \d+%\)\. Open ", out), out[-600:]
    assert os.path.exists(os.path.join(work, "data-bin", "spm.model"))
    last = os.path.join(work, "checkpoints", "checkpoint_last")  # sharded: a directory, written by both ranks
    assert os.path.isdir(last) and os.path.exists(os.path.join(last, "COMPLETE"))
    with open(os.path.join(work, "corpus.train.txt")) as f:
        assert "import" in f.read()  # built from the standard library's Python source


# -- user mistakes: refused up front, in shard-demo's words, before anything is written --------------

@pytest.mark.parametrize("flags,named", [
    (["--max-update", "1"], "--max-update"),  # half would be 0, which shard-train reads as "no limit"
    (["--max-update", "0"], "--max-update"),
    (["--max-update", "-4"], "--max-update"),
    (["--ranks", "0"], "--ranks"),  # was a ZeroDivisionError
    (["--ranks", "-1"], "--ranks"),
    (["--corpus-mb", "0.05"], "--corpus-mb"),  # was an empty valid split, reported by shard-train
    (["--corpus-mb", "0"], "--corpus-mb"),  # was "Could not find the Python standard library"
    (["--corpus-mb", "-3"], "--corpus-mb"),
    (["--corpus-mb", "nan"], "--corpus-mb"),
])
def test_bad_options_are_refused_before_anything_is_written(flags, named, tmp_path, capsys):
    work = tmp_path / "demo"
    err = refused(["--workdir", str(work)] + flags, capsys)
    assert named in err
    assert not work.exists()


def test_a_file_as_workdir_is_refused(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    err = refused(["--workdir", str(afile)], capsys)  # was a FileExistsError traceback
    assert "--workdir" in err and "Not a directory" in err
    assert afile.read_text() == "mine\n" and os.listdir(tmp_path) == ["afile"]


def test_more_ranks_than_gpus_is_refused_as_ranks(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    err = refused(["--workdir", str(tmp_path / "demo"), "--ranks", "2"], capsys)
    assert "--ranks 1 or less" in err and "--distributed-world-size" not in err


@pytest.mark.parametrize("gpus,ranks", [(0, 2), (1, 1), (2, 2), (8, 2)])
def test_default_ranks_fit_the_machine(gpus, ranks):
    chosen, note = demo.default_ranks(gpus)
    assert chosen == ranks
    assert (note is not None) == (ranks < 2)  # fewer ranks than the demo shows best: say so


def test_one_gpu_machine_trains_on_one_rank_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    FakeTools(monkeypatch)
    argvs = []
    monkeypatch.setattr(demo.train, "main", argvs.append)
    demo.main(["--workdir", str(tmp_path / "demo"), "--corpus-mb", "0.1", "--max-update", "2"])
    assert all(argv[argv.index("--distributed-world-size") + 1] == "1" for argv in argvs) and len(argvs) == 2
    assert "one GPU is visible, so the demo trains on 1 process" in capsys.readouterr().out


def refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as info:
        demo.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("shard-demo: error: ") and "Traceback" not in err
    return err


# -- the corpus -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_files", [2, 3, 12])
def test_every_corpus_has_a_valid_split(n_files, tmp_path):
    # Fewer than 11 files used to put nothing in valid.
    sizes = [os.path.getsize(p) for p in demo.stdlib_sources(10 ** 9)[:n_files]]
    paths = demo.write_corpus(str(tmp_path), sum(sizes))
    for split in ("train", "valid"):
        with open(paths[split]) as f:
            assert f.read().strip(), split


def test_smallest_allowed_corpus_has_both_splits(tmp_path):
    paths = demo.write_corpus(str(tmp_path), int(demo.MIN_CORPUS_MB * 1e6))
    assert all(os.path.getsize(p) > 0 for p in paths.values())


# -- phases and signals (training replaced by a stand-in: the control flow is what is tested) ------

class FakeTools:
    """Records the demo's calls; train.main behaves like shard-train on a signal
    (its handler takes the signal, then it returns normally)."""

    def __init__(self, monkeypatch, signal_in_phase=None):
        self.calls, self.signal_in_phase = [], signal_in_phase
        monkeypatch.setattr(demo.preprocess, "main", lambda argv: self.calls.append("preprocess"))
        monkeypatch.setattr(demo.train, "main", self.train)
        self.argvs = {}
        monkeypatch.setattr(demo.validate, "main", lambda argv: self.calls.append("validate") or
                            self.argvs.setdefault("validate", argv))
        monkeypatch.setattr(demo, "print_sample", lambda data, path: self.calls.append("sample"))
        monkeypatch.setattr(demo.plot, "main", lambda argv: self.calls.append("plot"))

    def train(self, argv):
        phase = sum(c.startswith("train") for c in self.calls) + 1
        self.calls.append(f"train {argv[argv.index('--max-update') + 1]}")
        self.argvs.setdefault("train", argv)
        watcher = PreemptionWatcher()
        try:
            if phase == self.signal_in_phase:
                os.kill(os.getpid(), signal.SIGTERM)
        finally:
            watcher.close()
        assert watcher.requested or phase != self.signal_in_phase


def test_both_phases_have_a_positive_limit(tmp_path, monkeypatch):
    tools = FakeTools(monkeypatch)
    demo.main(["--workdir", str(tmp_path / "demo"), "--corpus-mb", "0.1", "--max-update", "3"])
    assert tools.calls == ["preprocess", "train 1", "train 3", "validate", "sample", "plot"]


def test_defaults_fit_three_minutes(tmp_path, monkeypatch):
    # 500 updates took 4.5 min on 2 idle cores (issue 31); 240 fit in 3 (benchmarks/demo_time.py)
    tools = FakeTools(monkeypatch)
    demo.main(["--workdir", str(tmp_path / "demo"), "--corpus-mb", "0.1"])
    assert tools.calls == ["preprocess", "train 120", "train 240", "validate", "sample", "plot"]
    train = tools.argvs["train"]
    assert train[train.index("--validate-interval-updates") + 1] == "60"  # 4 points on the valid curve
    validate = tools.argvs["validate"]
    assert validate[validate.index("--batch-size") + 1] == "64" and "--max-valid-steps" not in validate


@pytest.mark.parametrize("phase", [1, 2])
def test_a_signal_during_training_stops_the_demo(phase, tmp_path, monkeypatch, capsys):
    tools = FakeTools(monkeypatch, signal_in_phase=phase)
    handler, wakeup_fd = signal.getsignal(signal.SIGTERM), signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup_fd)
    demo.main(["--workdir", str(tmp_path / "demo"), "--corpus-mb", "0.1", "--max-update", "4"])
    assert tools.calls == ["preprocess", "train 2", "train 4"][:1 + phase]  # no later phase, no validate
    assert "stopped by SIGTERM/SIGUSR1" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) == handler and signal.set_wakeup_fd(wakeup_fd) == wakeup_fd  # restored
