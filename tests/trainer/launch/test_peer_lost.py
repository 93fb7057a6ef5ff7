"""A surviving rank whose peer died mid-training (issue 29, red-team item 6): one paragraph saying another
rank stopped, where to look and that a relaunch resumes, and a non-zero exit; not gloo's traceback.

Two real gloo ranks started as a launcher starts them (SLURM's task variables, a file:// rendezvous:
no port), the same path as torchrun's ranks (start._run_launched). Rank 1 os._exit()s at its 6th batch."""
import os
import subprocess
import sys

import pytest

from shardtrain.core.errors import ShardtrainError
from shardtrain.trainer.launch.peer_lost import as_peer_lost_error
from st_testutils import make_space_data_bin, scaled, tiny_model_flags

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


@pytest.mark.slow
def test_the_surviving_rank_says_its_peer_stopped_and_exits_non_zero(tmp_path):
    data = make_space_data_bin(str(tmp_path), n_words=6, train_tokens=4000, valid_tokens=100, line_len=20)
    command = [sys.executable, "-m", "shardtrain.cli.train", data, *tiny_model_flags(), "--task", "lm_peer_exits",
               "--user-dir", os.path.join(HERE, "peer_exit_plugin"), "--exit-at-batch", "6", "--cpu",
               "--max-update", "50", "--disable-validation", "--save-interval-updates", "2", "--no-epoch-checkpoints",
               "--distributed-init-method", f"file://{tmp_path}/rendezvous", "--save-dir", str(tmp_path / "ck")]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=REPO, SLURM_NTASKS="2", SLURM_JOB_ID=str(os.getpid()))
    ranks = [subprocess.Popen(command, env={**env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        errs = [rank.communicate(timeout=scaled(180))[1] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    assert ranks[1].returncode == 3  # the plugin's os._exit
    survivor = errs[0]
    assert ranks[0].returncode == 2, survivor[-3000:]
    assert "Traceback" not in survivor and survivor.count("shard-train: error:") == 1, survivor[-3000:]
    assert "shard-train: error: Rank 0 of 2 lost its connection to another rank" in survivor
    assert "The cause is in the log of rank 1" in survivor
    assert "relaunching the same command resumes from checkpoint_last" in survivor
    assert os.path.isdir(tmp_path / "ck" / "checkpoint_last") or os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


def test_nccl_and_gloo_texts_are_recognised_and_others_are_not():
    """NCCL's texts as ProcessGroupNCCL raises them (DistBackendError, a RuntimeError), copied from torch
    2.11's libtorch_cuda.so; a wrapped one is found through its cause."""
    for text in ["[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41075",
                 "NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error, "
                 "NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a network error or a remote "
                 "process exiting prematurely.",
                 "NCCL communicator was aborted on rank 3."]:
        error = RuntimeError(text)
        assert isinstance(as_peer_lost_error(error, 0, 4), ShardtrainError), text
    wrapped = ValueError("checkpoint write failed")
    wrapped.__cause__ = RuntimeError("Connection reset by peer")
    assert "Rank 2 of 8 lost its connection to another rank" in str(as_peer_lost_error(wrapped, 2, 8))
    assert as_peer_lost_error(RuntimeError("CUDA out of memory"), 0, 2) is None
    assert "the one at 10.0.0.7" in str(as_peer_lost_error(
        RuntimeError("pair.cc:534] Connection closed by peer [10.0.0.7]:4000"), 0, 2))
