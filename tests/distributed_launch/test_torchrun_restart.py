"""torchrun --max-restarts: a rank killed mid-run makes torchrun restart the group, which resumes from
checkpoint_last on its own; the final weights equal an uninterrupted run's. Also with the save-dir lock's
holder (rank 0) killed while an --async-save of fully_sharded is still in flight, and with torchrun
itself preempted (SIGTERM): the ranks save and stop, and the relaunched job finishes the same."""
import os
import subprocess
import sys

import pytest
import torch

from shardtrain.trainer.checkpoint.consolidate import read_sharded
from st_testutils import last_checkpoint_state, make_space_data_bin, tiny_model_flags

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
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


def assert_same_end(tmp_path, reference_dir, healed_dir):
    assert last_checkpoint_state(healed_dir)["train_state"]["num_updates"] == 12
    expected, got = final_weights(str(reference_dir)), final_weights(str(healed_dir))
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    """The reference runs, never killed, by backend (pytorch_ddp is shared by two tests)."""
    made = {}

    def run(backend):
        if backend not in made:
            work = tmp_path_factory.mktemp(f"whole-{backend}")
            extra = SHARDED if backend == "fully_sharded_async" else []
            whole = torchrun(work, data, *tiny_model_flags(), *FLAGS, *extra, "--save-dir", str(work / "whole"))
            assert whole.returncode == 0, whole.stderr[-3000:]
            made[backend] = work / "whole"
        return made[backend]
    return run


@pytest.mark.parametrize("backend", ["pytorch_ddp", "fully_sharded_async"])
def test_a_killed_rank_is_restarted_by_torchrun_and_resumes_exactly(data, tmp_path, backend, uninterrupted):
    """pytorch_ddp: rank 1 dies. fully_sharded --async-save: rank 0 (the save-dir lock's holder and the
    rank that finalizes checkpoints) dies while checkpoint 8 is still being written in the background: the
    restarted group takes the lock, clears the dead save's partial directory and resumes from update 4."""
    extra = SHARDED if backend == "fully_sharded_async" else []
    kill = ["--kill-at-batch", "10"] + (["--kill-rank", "0", "--slow-finalize-s", "3"] if extra else [])
    killed = torchrun(tmp_path, data, *tiny_model_flags(), *FLAGS, *extra, *kill,
                      "--save-dir", str(tmp_path / "killed"), restarts=1)
    output = killed.stdout + killed.stderr
    assert killed.returncode == 0, output[-3000:]
    assert "Signals.SIGKILL" in output or "exitcode: -9" in output, output[-3000:]
    resumed_from = 4 if extra else 8  # the async save of update 8 was cut short
    assert f"(epoch 1 @ {resumed_from} updates" in output, output[-3000:]  # resumed by itself
    assert_same_end(tmp_path, uninterrupted(backend), tmp_path / "killed")


def test_a_preempted_torchrun_job_saves_and_the_relaunch_finishes_exactly(data, tmp_path, uninterrupted):
    """SIGTERM to torchrun (a scheduler's preemption): torchrun passes it to the ranks, which finish their
    update, save checkpoint_last and exit; relaunching the same command (as a requeue does) finishes the run
    with the uninterrupted run's weights."""
    args = [data, *tiny_model_flags(), *FLAGS, "--save-dir", str(tmp_path / "preempted")]
    preempted = torchrun(tmp_path, *args, "--preempt-at-batch", "6", restarts=3)
    output = preempted.stdout + preempted.stderr
    saved = last_checkpoint_state(tmp_path / "preempted")["train_state"]["num_updates"]
    assert 5 <= saved < 12, output[-3000:]  # saved at the preemption, not at an interval (4, 8)
    assert saved not in (4, 8), output[-3000:]
    relaunched = torchrun(tmp_path, *args)
    assert relaunched.returncode == 0, relaunched.stderr[-3000:]
    assert_same_end(tmp_path, uninterrupted("pytorch_ddp"), tmp_path / "preempted")
