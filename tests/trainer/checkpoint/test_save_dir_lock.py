"""Two runs in one --save-dir: the second is refused naming the first; a
killed run leaves no lock behind."""
import os
import signal
import subprocess
import sys
import time

import pytest

from shardtrain.cli import train
from shardtrain.trainer.checkpoint.save_dir_lock import LOCK_NAME
from st_testutils import make_space_data_bin, tiny_model_flags


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("lock")), n_words=6, train_tokens=3000,
                               valid_tokens=300, line_len=30, seed=8)


def wait_for_line(proc, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        if text in line:
            return
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s"
    pytest.fail(f"the first run ended before printing {text!r}")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["pytorch_ddp", "fully_sharded"])
def test_second_run_in_a_save_dir_is_refused_until_the_first_is_gone(backend, data_bin, tmp_path, capsys):
    save = tmp_path / "save"
    flags = [data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", backend, "--save-dir", str(save)]
    # the first run makes the save dir at its first save (update 1), then keeps training
    first = subprocess.Popen([sys.executable, "-m", "shardtrain.cli.train", *flags, "--max-update", "100000",
                              "--save-interval-updates", "1", "--keep-interval-updates", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_line(first, '"num_updates": "2"', timeout_s=60)
        with pytest.raises(SystemExit) as info:
            # bounded: were it not refused, it would end (and fail here) rather than train on
            train.main(flags + ["--max-update", "100001", "--max-epoch", "1"])
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"Another run (pid {first.pid} on " in err and "--save-dir" in err, err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL  # it was still training: the refusal did not stop it
    # SIGKILL leaves the file but not the lock: the next run resumes
    assert os.path.exists(save / LOCK_NAME)
    train.main(flags + ["--max-update", "100000", "--max-epoch", "1"])
    out, err = capsys.readouterr()
    assert "loaded checkpoint" in out + err


@pytest.fixture(scope="module")
def long_epoch_data_bin(tmp_path_factory):
    """About 200 updates per epoch: the first run is still before its first save when the second starts."""
    return make_space_data_bin(str(tmp_path_factory.mktemp("lock_long")), n_words=6, train_tokens=50000,
                               valid_tokens=300, line_len=30, seed=8)


@pytest.mark.slow
def test_second_run_on_a_new_save_dir_is_refused_at_start(long_epoch_data_bin, tmp_path, capsys):
    """The first run made the save dir and holds it before it ever saves (red-team item 4 of issue 16:
    the lock used to be taken only at the first save, so a second run trained until then)."""
    save = tmp_path / "new" / "save"
    flags = [long_epoch_data_bin, *tiny_model_flags(), "--cpu", "--save-dir", str(save), "--disable-validation"]
    first = subprocess.Popen([sys.executable, "-m", "shardtrain.cli.train", *flags, "--max-update", "100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_line(first, '"num_updates": "1"', timeout_s=60)
        assert os.listdir(save) == [LOCK_NAME]  # no checkpoint yet
        with pytest.raises(SystemExit) as info:
            train.main(flags + ["--max-update", "3"])
        out, err = capsys.readouterr()
        assert info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"Another run (pid {first.pid} on " in err, err
        assert "num_updates" not in out + err  # refused before training
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL
    assert os.listdir(save) == [LOCK_NAME]  # the refused run removed nothing of the first one's


def test_a_run_that_fails_to_start_leaves_no_save_dir(data_bin, tmp_path, capsys):
    """The lock made the (nested, new) save dir at start; failing before any save removes it again."""
    save = tmp_path / "a" / "b"
    with pytest.raises(SystemExit) as info:
        train.main([data_bin, *tiny_model_flags(), "--cpu", "--save-dir", str(save), "--valid-subset", "nosuch"])
    assert info.value.code == 2, capsys.readouterr().err
    assert "nosuch" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_a_run_that_fails_after_taking_the_lock_leaves_no_save_dir(data_bin, tmp_path, capsys, monkeypatch):
    """The failure above is found before launch, before any lock; this one comes while the model is built, with
    the lock held (the save dir made for it): closing removes the lock and the dirs it made."""
    from shardtrain.core.errors import ConfigError
    from shardtrain.trainer import loop
    made = []

    def failing_build(run, *args):
        made.append(sorted(os.listdir(save)))
        raise ConfigError("the model cannot be built (a stand-in for any failure while the run starts)")

    monkeypatch.setattr(loop.Run, "_build", failing_build)
    save = tmp_path / "a" / "b"
    with pytest.raises(SystemExit) as info:
        train.main([data_bin, *tiny_model_flags(), "--cpu", "--save-dir", str(save)])
    assert info.value.code == 2 and "cannot be built" in capsys.readouterr().err
    assert made == [[LOCK_NAME]]  # the lock was held when it failed
    assert os.listdir(tmp_path) == []
