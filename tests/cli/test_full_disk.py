"""A save that fails for lack of space: a clear error, non-zero exit, previous checkpoints untouched."""
import subprocess
import sys

import pytest
import torch

from shardtrain.trainer.checkpoint.save_dir_lock import LOCK_NAME
from shardtrain.trainer.checkpoint.integrity import verify_checkpoint
from st_testutils import make_space_data_bin, tiny_model_flags

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

# Runs training with a file-size limit, the same failure a full disk gives a
# writer (EFBIG instead of ENOSPC; SIGXFSZ ignored so the write returns the error).
LIMITED = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
from shardtrain.cli import train
train.main(sys.argv[1:])
"""


@pytest.mark.parametrize("backend", ["pytorch_ddp", "fully_sharded"])
def test_failed_save_leaves_previous_checkpoints_intact(backend, tmp_path):
    data = make_space_data_bin(str(tmp_path), n_words=8, train_tokens=4000, valid_tokens=200, line_len=40)
    save = tmp_path / "ck"
    args = [data, *tiny_model_flags(), "--save-dir", str(save), "--ddp-backend", backend, "--cpu",
            "--disable-validation"]
    first = subprocess.run([sys.executable, "-m", "shardtrain.cli.train", *args, "--max-update", "2"],
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr[-2000:]
    # every file but the run lock, which each run rewrites with its pid
    before = {p.name: p.stat().st_mtime for p in save.iterdir() if p.name != LOCK_NAME}
    second = subprocess.run([sys.executable, "-c", LIMITED, *args, "--max-update", "4"],
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stderr[-2000:]
    assert "Saving the checkpoint of update 4" in second.stderr and "previous checkpoints are intact" in \
        second.stderr.replace("\n", " ")
    assert "Traceback" not in second.stderr
    after = {p.name: p.stat().st_mtime for p in save.iterdir() if p.name != LOCK_NAME}
    assert after == before  # nothing new, nothing touched
    last = save / ("checkpoint_last" if backend == "fully_sharded" else "checkpoint_last.pt")
    extra = torch.load(last / "extra.pt" if last.is_dir() else last, weights_only=True)
    assert extra["train_state"]["num_updates"] == 2


# The same limit where ranks are spawned (each imports this as its main module: the guard keeps them from
# re-running it); the limit and the ignored signal are inherited.
LIMITED_SPAWNING = """
import resource, signal, sys
if __name__ == "__main__":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
    from shardtrain.cli import train
    train.main(sys.argv[1:])
"""


def test_failed_async_save_on_two_ranks_is_as_clean_as_a_synchronous_one(tmp_path):
    """--async-save writes in the background: its failure is named (no space), in one paragraph without
    torch's tracebacks, and its partial directory is removed (red-team item 5)."""
    data = make_space_data_bin(str(tmp_path), n_words=8, train_tokens=4000, valid_tokens=200, line_len=40)
    save = tmp_path / "ck"
    args = [data, *tiny_model_flags(), "--save-dir", str(save), "--ddp-backend", "fully_sharded", "--cpu",
            "--disable-validation", "--distributed-world-size", "2", "--async-save"]
    first = subprocess.run([sys.executable, "-m", "shardtrain.cli.train", *args, "--max-update", "2"],
                           capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stderr[-2000:]
    before = {p.name: p.stat().st_mtime for p in save.iterdir() if p.name != LOCK_NAME}
    script = tmp_path / "limited.py"
    script.write_text(LIMITED_SPAWNING)
    second = subprocess.run([sys.executable, str(script), *args, "--max-update", "4"],
                            capture_output=True, text=True, timeout=180)
    err = second.stderr.replace("\n", " ")
    assert second.returncode == 2, second.stderr[-2000:]
    assert "Saving the checkpoint checkpoint_1_4 (in the background, --async-save)" in err and "no space" in err
    assert "previous checkpoints are intact" in err
    assert "Traceback" not in second.stderr and "unexpected pos" not in second.stderr
    assert not [p.name for p in save.iterdir() if p.name.endswith(".partial")]
    after = {p.name: p.stat().st_mtime for p in save.iterdir() if p.name.startswith("checkpoint")}
    assert after == {name: t for name, t in before.items() if name.startswith("checkpoint")}  # config.yaml: rewritten
    assert verify_checkpoint(str(save / "checkpoint_last")).startswith("intact")
