"""A fairseq fully-sharded command line under torchrun (2 CPU ranks): the accepted fairseq flags are said
once per run (rank 0), each in one line, and the run trains."""
import os
import subprocess
import sys

import pytest

from st_testutils import make_space_data_bin, scaled, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.launch"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ACCEPTED = ["--use-sharded-state", "--not-fsdp-flatten-parameters", "--fp32-reduce-scatter", "--num-workers", "2",
            "--dataset-impl", "mmap", "--distributed-port", "12345", "--empty-cache-freq", "100"]


def test_accepted_fairseq_flags_are_said_once_under_torchrun(tmp_path):
    data = make_space_data_bin(str(tmp_path), train_tokens=3000, valid_tokens=300)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "shardtrain.cli.train", data, *tiny_model_flags(), "--cpu", "--ddp-backend", "fully_sharded",
               "--max-update", "2", "--disable-validation", "--save-dir", str(tmp_path / "ck"), *ACCEPTED]
    done = subprocess.run(command, cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=scaled(240))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    notices = [line for line in output.splitlines() if "is accepted for fairseq compatibility" in line]
    said = sorted(line.split(": notice: ")[1].split(" is accepted")[0] for line in notices)
    assert said == sorted(["--use-sharded-state", "--not-fsdp-flatten-parameters", "--fp32-reduce-scatter",
                           "--num-workers 2", "--dataset-impl mmap", "--distributed-port 12345",
                           "--empty-cache-freq 100"]), output[-4000:]
    assert os.path.isdir(tmp_path / "ck" / "checkpoint_last")  # sharded, as the notice for --use-sharded-state says
