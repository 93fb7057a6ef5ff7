"""torchrun --max-restarts: a rank killed mid-run makes torchrun restart the group, which resumes from
checkpoint_last on its own; the final weights equal an uninterrupted run's."""
import os
import subprocess
import sys

import torch

from st_testutils import last_checkpoint_state, make_space_data_bin, tiny_model_flags

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
FLAGS = ["--task", "lm_killed_once", "--user-dir", os.path.join(HERE, "kill_plugin"), "--max-update", "12",
         "--save-interval-updates", "4", "--no-epoch-checkpoints", "--disable-validation", "--lr", "0.01",
         "--lr-scheduler", "fixed", "--log-format", "simple"]


def torchrun(tmp_path, *args, restarts=0):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", str(restarts), "-m", "shardtrain.cli.train", *args]
    return subprocess.run(command, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)


def test_a_killed_rank_is_restarted_by_torchrun_and_resumes_exactly(tmp_path):
    data = make_space_data_bin(str(tmp_path), n_words=12, train_tokens=8000)
    whole = torchrun(tmp_path, data, *tiny_model_flags(), *FLAGS, "--save-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = torchrun(tmp_path, data, *tiny_model_flags(), *FLAGS, "--kill-at-batch", "10",
                      "--save-dir", str(tmp_path / "killed"), restarts=1)
    output = killed.stdout + killed.stderr
    assert killed.returncode == 0, output[-3000:]
    assert "SIGKILL" in output or "Signals.SIGKILL" in output or "exitcode: -9" in output, output[-3000:]
    assert "loaded checkpoint" in output  # the restarted group resumed from checkpoint_last by itself
    expected, got = last_checkpoint_state(tmp_path / "whole"), last_checkpoint_state(tmp_path / "killed")
    assert got["train_state"]["num_updates"] == expected["train_state"]["num_updates"] == 12
    for name, tensor in expected["model"].items():
        assert torch.equal(got["model"][name], tensor), name
