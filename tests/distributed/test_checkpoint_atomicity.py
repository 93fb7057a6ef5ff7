"""SIGKILL at any moment of a save never leaves a torn checkpoint under a checkpoint name.

Training saves after every update; the job is killed after different delays,
so the kill lands at different points of model/optimizer writes, the extra
state, the COMPLETE marker, the rename and the alias swap. After each kill,
checkpoint_last must load and every visible checkpoint must be complete; a
partial directory is never picked, and naming one explicitly is an error.
"""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from shardtrain.errors import CheckpointError
from shardtrain.trainer.checkpoints import load_checkpoint
from shardtrain.trainer.sharded_checkpoints import check_complete, load_extra
from st_testutils import make_space_data_bin


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("kill")), n_words=8, train_tokens=20000,
                               valid_tokens=200, line_len=40)


def start(data_bin, save_dir, backend):
    command = [sys.executable, "-m", "shardtrain.cli.train", data_bin, "--arch", "transformer_lm",
               "--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "128",
               "--decoder-attention-heads", "2", "--tokens-per-sample", "32", "--batch-size", "4",
               "--save-interval-updates", "1", "--disable-validation", "--max-update", "10000", "--cpu",
               "--threads", "1", "--log-format", "none", "--save-dir", str(save_dir), "--ddp-backend", backend]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


@pytest.mark.parametrize("backend", ["fully_sharded", "pytorch_ddp"])
def test_kill_during_saves_leaves_a_loadable_checkpoint_last(backend, data_bin, tmp_path):
    save = tmp_path / "ck"
    proc = start(data_bin, save, backend)
    deadline = time.time() + 120
    while not (save / ("checkpoint_last" if backend == "fully_sharded" else "checkpoint_last.pt")).exists():
        assert time.time() < deadline and proc.poll() is None, "training did not start saving"
        time.sleep(0.05)
    for delay in (0.013, 0.057, 0.101, 0.149, 0.211):  # land in different phases of back-to-back saves
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        check_save_dir(save, backend)
        proc = start(data_bin, save, backend)  # resumes from checkpoint_last, keeps saving
        time.sleep(2.0)  # let it start and save again
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    check_save_dir(save, backend)


def check_save_dir(save, backend):
    if backend == "fully_sharded":
        extra = load_extra(str(save / "checkpoint_last"))
        assert extra["train_state"]["num_updates"] >= 1
        for entry in save.iterdir():
            if entry.name.startswith("checkpoint"):
                check_complete(str(entry))  # every visible name is whole
            elif entry.name != "config.yaml":  # the run's resolved config, written after each save
                assert entry.name.startswith("."), entry  # only hidden temporaries besides
                if entry.is_dir():
                    with pytest.raises(CheckpointError, match="incomplete"):
                        check_complete(str(entry))
    else:
        state = load_checkpoint(str(save / "checkpoint_last.pt"))
        assert state["train_state"]["num_updates"] >= 1
        for entry in save.iterdir():
            if entry.name.startswith("checkpoint"):
                torch.load(entry, weights_only=True)
