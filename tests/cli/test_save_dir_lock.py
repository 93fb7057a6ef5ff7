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
