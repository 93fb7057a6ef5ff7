"""tests/gpu/test_async_save.py's exact-resume check on the CPU, where it can be seen to fail: a
checkpoint named for update 3 that holds update 2's weights and optimizer state (what a save that
snapshots the wrong update leaves) resumes to other final weights, while the real one resumes bit
for bit. At the default schedule (lr <= 7.5e-7) the losses of both, rounded to 3 decimals, were the
same: the check is on the state itself, at an lr that moves every weight."""
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "gpu"))
import gpu_runs  # noqa: E402
from exact_resume import HALF, MOVING_LR, UPDATES, assert_resumed_exactly, checkpoint_state, differences, \
    straight_and_resumed  # noqa: E402
from shardtrain.cli import train  # noqa: E402
from shardtrain.trainer.checkpoint.checksums import MANIFEST, file_entry, manifest_bytes, read_manifest  # noqa: E402
from st_testutils import json_records, make_space_data_bin  # noqa: E402

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


def train_here(data, save_dir, *flags):
    """gpu_runs.train on the CPU, in this process (no interpreter start per run)."""
    log = str(save_dir) + ".log"
    train.main([data, *gpu_runs.MODEL, "--cpu", "--threads", "1", "--save-dir", str(save_dir), "--log-file", log,
                "--log-format", "json", "--log-interval", "1", "--disable-validation", *flags])
    return json_records(log, "train_inner"), []


def mislabelled(src, label, dst) -> None:
    """``src``'s tensors (model, optimizer) under ``label``'s name and training state, checksums made good."""
    shutil.copytree(src, dst)
    for name in ("extra.pt", "COMPLETE"):
        shutil.copy(os.path.join(label, name), os.path.join(dst, name))
    files = read_manifest(str(dst))
    files.update({name: file_entry(os.path.join(dst, name)) for name in ("extra.pt", "COMPLETE")})
    with open(os.path.join(dst, MANIFEST), "wb") as f:
        f.write(manifest_bytes(files))


def test_the_exact_resume_check_catches_a_checkpoint_of_the_wrong_update(tmp_path):
    data = make_space_data_bin(str(tmp_path / "data"), n_words=64, train_tokens=8000, valid_tokens=400,
                               line_len=60)
    flags = ["--ddp-backend", "fully_sharded", "--distributed-world-size", "1", "--async-save", *MOVING_LR]
    losses, resumed_losses, straight, resumed = straight_and_resumed(train_here, data, tmp_path, flags, save_every=1)
    saved = tmp_path / "straight"
    halfway = checkpoint_state(str(saved / f"checkpoint_1_{HALF}"))
    assert_resumed_exactly(losses, resumed_losses, straight, resumed, halfway)

    wrong = tmp_path / "wrong.ck"
    mislabelled(saved / f"checkpoint_1_{HALF - 1}", saved / f"checkpoint_1_{HALF}", wrong)
    assert checkpoint_state(str(wrong))["/num_updates"] == HALF
    train_here(data, tmp_path / "from-wrong", *flags, "--max-update", str(UPDATES), "--restore-file", str(wrong))
    found = differences(straight, checkpoint_state(str(tmp_path / "from-wrong" / "checkpoint_last")))
    weights = [k for k in halfway if k.startswith("/model/")]
    assert set(weights) <= set(found), "every weight ends elsewhere after a resume from update 2's state"
    assert any(k.endswith("/exp_avg") for k in found) and "/num_updates" not in found
