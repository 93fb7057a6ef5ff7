"""torchrun --max-restarts: a rank killed mid-run makes torchrun restart the group, which resumes from
checkpoint_last on its own; the final weights equal an uninterrupted run's. Also with the save-dir lock's
holder (rank 0) killed while an --async-save of fully_sharded is still in flight, and with torchrun
itself preempted (SIGTERM): the ranks save and stop, and the relaunched job finishes the same.

The pytorch_ddp kill and the preemption are one job's story (one torchrun launch fewer): preempted, then
relaunched, where rank 1 is killed after the interval save of update 8 and torchrun restarts the group. The
uninterrupted references are 2-rank runs this process spawns (the same ranks, seeds and thread counts as
torchrun's): torchrun is the subject of the interrupted runs only."""
import os
import re
import subprocess
import sys

import pytest
import torch

from shardtrain.trainer.checkpoint.consolidate import read_sharded
from st_testutils import last_checkpoint_state, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.launch"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
FLAGS = ["--task", "lm_killed_once", "--user-dir", os.path.join(HERE, "kill_plugin"), "--max-update", "12",
         "--save-interval-updates", "4", "--no-epoch-checkpoints", "--disable-validation", "--lr", "0.01",
         "--lr-scheduler", "fixed", "--log-format", "simple", "--dropout", "0.1"]
SHARDED = ["--ddp-backend", "fully_sharded", "--async-save"]


def torchrun(tmp_path, *args, restarts=0):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", str(restarts), "-m", "shardtrain.cli.train", *args]
    return subprocess.run(command, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("restart")), n_words=12, train_tokens=8000)


def final_weights(save_dir):
    """checkpoint_last's model, in either form (a sharded one read whole, as shard-consolidate does)."""
    sharded = os.path.join(save_dir, "checkpoint_last")
    if not os.path.isdir(sharded):
        return last_checkpoint_state(save_dir)["model"]
    state = read_sharded(sharded, model_only=True)
    return state.get("model", state)


def assert_same_end(reference_dir, healed_dir):
    assert last_checkpoint_state(healed_dir)["train_state"]["num_updates"] == 12
    expected, got = final_weights(str(reference_dir)), final_weights(str(healed_dir))
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def resumed_from(output: str) -> list:
    """The updates each attempt's rank 0 loaded checkpoint_last at, in order."""
    return [int(n) for n in re.findall(r"loaded checkpoint \S+ \(epoch 1 @ (\d+) updates", output)]


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    """The reference runs, never killed, by backend: 2 ranks spawned by shard-train's main in this process."""
    from shardtrain.cli import train

    made = {}

    def run(backend):
        if backend not in made:
            save = tmp_path_factory.mktemp(f"whole-{backend}") / "whole"
            extra = SHARDED if backend == "fully_sharded_async" else []
            train.main([data, *tiny_model_flags(), *FLAGS, *extra, "--save-dir", str(save),
                        "--distributed-world-size", "2"])
            made[backend] = save
        return made[backend]
    return run


@pytest.fixture(scope="module")
def preempted_then_killed(data, tmp_path_factory):
    """SIGTERM to torchrun (a scheduler's preemption) at batch 6; the relaunch (as a requeue does) has rank 1
    SIGKILLed collating update 10's batch, after the interval save of update 8 (or of the preemption, if later)."""
    work = tmp_path_factory.mktemp("preempted")
    args = [data, *tiny_model_flags(), *FLAGS, "--save-dir", str(work / "ck")]
    preempted = torchrun(work, *args, "--preempt-at-batch", "6", restarts=3)
    saved = last_checkpoint_state(work / "ck")["train_state"]["num_updates"]
    # the plugin counts the batches this process collated: the relaunch's first is update saved + 1's
    relaunched = torchrun(work, *args, "--kill-at-batch", str(max(1, 10 - saved)), restarts=1)
    return {"preempted": preempted.stdout + preempted.stderr, "saved": saved, "relaunched": relaunched,
            "save_dir": work / "ck"}


@pytest.mark.parametrize("backend", ["pytorch_ddp", "fully_sharded_async"])
def test_a_killed_rank_is_restarted_by_torchrun_and_resumes_exactly(data, tmp_path, backend, uninterrupted,
                                                                    preempted_then_killed):
    """pytorch_ddp: rank 1 dies (in the relaunch of a preempted job). fully_sharded --async-save: rank 0 (the
    save-dir lock's holder and the rank that finalizes checkpoints) dies while checkpoint 8 is still being
    written in the background: the restarted group takes the lock, clears the dead save's partial directory
    and resumes from update 4."""
    if backend == "pytorch_ddp":
        killed, save_dir = preempted_then_killed["relaunched"], preempted_then_killed["save_dir"]
        # first from the preemption's save, then (restarted by torchrun) from update 8's
        expected = [preempted_then_killed["saved"], max(8, preempted_then_killed["saved"])]
    else:
        save_dir = tmp_path / "killed"
        killed = torchrun(tmp_path, data, *tiny_model_flags(), *FLAGS, *SHARDED, "--kill-at-batch", "10",
                          "--kill-rank", "0", "--slow-finalize-s", "3", "--save-dir", str(save_dir), restarts=1)
        expected = [4]  # the async save of update 8 was cut short
    output = killed.stdout + killed.stderr
    assert killed.returncode == 0, output[-3000:]
    assert "Signals.SIGKILL" in output or "exitcode: -9" in output, output[-3000:]
    assert resumed_from(output) == expected, output[-3000:]  # resumed by itself
    assert_same_end(uninterrupted(backend), save_dir)


def test_a_preempted_torchrun_job_saves_and_the_relaunch_finishes_exactly(uninterrupted, preempted_then_killed):
    """SIGTERM to torchrun: torchrun passes it to the ranks, which finish their update, save checkpoint_last and
    exit; relaunching the same command finishes the run with the uninterrupted run's weights (a kill and
    torchrun's restart on the way, test_a_killed_rank_...[pytorch_ddp]'s)."""
    output, saved = preempted_then_killed["preempted"], preempted_then_killed["saved"]
    assert 5 <= saved < 12, output[-3000:]  # saved at the preemption, not at an interval (4, 8)
    assert saved not in (4, 8), output[-3000:]
    relaunched = preempted_then_killed["relaunched"]
    assert relaunched.returncode == 0, relaunched.stderr[-3000:]
    assert resumed_from(relaunched.stdout + relaunched.stderr)[:1] == [saved]
    assert_same_end(uninterrupted("pytorch_ddp"), preempted_then_killed["save_dir"])
