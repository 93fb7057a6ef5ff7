"""SIGTERM/SIGUSR1: finish the update, save checkpoint_last, exit 0; relaunching resumes."""
import functools
import os
import signal
import subprocess
import sys

import pytest
import torch

from shardtrain.trainer.launch.preemption import (PreemptionWatcher, RequeueFailed, requeue_after_warning,
                                                  slurm_job_id)
from side_by_side import Budget, finish, run_side_by_side, start_under_way, train_command
from st_testutils import last_checkpoint_state, make_space_data_bin, tiny_model_flags

SIGNALLED = [(signal.SIGTERM, 1, True), (signal.SIGUSR1, 2, True)]  # (signal, ranks, under SLURM)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The end-to-end runs of this module, side by side (tests/side_by_side.py): {name: Outcome}."""
    root = tmp_path_factory.mktemp("preemption")
    data = make_space_data_bin(str(root), n_words=8, train_tokens=20000, valid_tokens=200, line_len=40)
    cases = {f"{sig}-{ranks}-{slurm}": functools.partial(signal_then_resume, data, root / f"{sig}-{ranks}", sig,
                                                         ranks, slurm) for sig, ranks, slurm in SIGNALLED}
    cases["failed requeue"] = functools.partial(failed_requeue, data, root / "failed-requeue")
    budget = Budget(len(cases))
    return run_side_by_side({name: functools.partial(case, budget) for name, case in cases.items()})


def signal_then_resume(data, root, sig, ranks, slurm, budget):
    """Stop a run with ``sig`` once it is under way, then relaunch it for 2 more updates."""
    root.mkdir()
    env, calls = dict(os.environ), root / "scontrol-calls"
    if slurm:
        bin_dir = root / "bin"
        bin_dir.mkdir()
        (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
        (bin_dir / "scontrol").chmod(0o755)
        env.update(SLURM_JOB_ID="4242", PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    save = root / "ck"
    command = train_command(data, save, ranks)
    proc = start_under_way(command, budget, env=env)
    proc.send_signal(sig)
    out, err = finish(proc, budget(60))
    stopped_at = updates_in(save) if proc.returncode == 0 else None
    requeued = calls.read_text() if calls.exists() else ""
    resumed = None
    if stopped_at is not None:
        resumed = subprocess.run(command[:command.index("100000")] + [str(stopped_at + 2)]
                                 + command[command.index("100000") + 1:], capture_output=True, text=True,
                                 timeout=budget(120), env=env)
    return proc, err, stopped_at, requeued, resumed, save


@pytest.mark.slow
@pytest.mark.parametrize("sig,ranks,slurm", SIGNALLED)
def test_signal_saves_and_exits_zero_then_resumes(sig, ranks, slurm, runs):
    """Under SLURM (SLURM_JOB_ID; scontrol is a stand-in that records its arguments), SIGUSR1 (the
    time-limit warning) also requeues the job once checkpoint_last is saved; SIGTERM does not."""
    proc, err, stopped_at, requeued, resumed, save = runs[f"{sig}-{ranks}-{slurm}"].get()
    assert proc.returncode == 0, err[-2000:]
    assert stopped_at >= 3
    assert requeued == ("requeue 4242\n" if slurm and sig == signal.SIGUSR1 else ""), (requeued, err[-2000:])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"@ {stopped_at} updates" in resumed.stdout  # loaded checkpoint ... (epoch 1 @ N updates)
    assert updates_in(save) == stopped_at + 2


def updates_in(save) -> int:
    return last_checkpoint_state(save)["train_state"]["num_updates"]


class TwoRanks:
    """A backend of 2 ranks whose all-reduce adds ``others`` (the other rank's stop flag)."""

    world_size, device = 2, torch.device("cpu")

    def __init__(self, others: float):
        self.others = others

    def all_reduce_sum(self, values):
        return values + self.others


def test_the_requeued_job_id():
    assert slurm_job_id({"SLURM_JOB_ID": "7"}) == "7"
    assert slurm_job_id({"SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "5", "SLURM_ARRAY_TASK_ID": "2"}) == "5_2"
    assert slurm_job_id({}) is None
    assert not requeue_after_warning({signal.SIGUSR1}, {})  # not a SLURM job: nothing to requeue


def test_a_stop_on_one_rank_is_agreed_by_every_rank():
    """The launcher forwards a signal to every rank, but each sees it (or its clock pass
    --stop-time-hours) at its own moment: a rank that saw nothing must stop too."""
    watcher = PreemptionWatcher()
    try:
        assert not watcher.agreed(TwoRanks(others=0.0))
        assert watcher.agreed(TwoRanks(others=1.0))  # only the other rank was signalled
        assert watcher.agreed(TwoRanks(others=0.0), also=True)  # this rank's own clock
        watcher._handle(signal.SIGTERM, None)
        assert watcher.agreed(TwoRanks(others=0.0))
    finally:
        watcher.close()


def fake_scontrol(bin_dir, script: str) -> dict:
    """An environment in a SLURM job whose PATH holds only ``bin_dir`` (with ``scontrol`` running
    ``script``, unless it is empty) before the usual PATH."""
    bin_dir.mkdir(exist_ok=True)
    if script:
        (bin_dir / "scontrol").write_text(f"#!/bin/sh\n{script}\n")
        (bin_dir / "scontrol").chmod(0o755)
    return {"SLURM_JOB_ID": "4242", "PATH": str(bin_dir)}


@pytest.mark.parametrize("script,why", [
    ("", "scontrol is not on PATH"),
    ("echo 'scontrol: error: Requeue not allowed for job 4242' >&2; exit 1",
     "`scontrol requeue 4242` failed with exit code 1: scontrol: error: Requeue not allowed for job 4242"),
])
@pytest.mark.slow
def test_a_requeue_that_does_not_happen_is_an_error_naming_the_command(script, why, tmp_path, monkeypatch):
    """The scheduler must see a failure: a warning and exit 0 made SLURM record the job as COMPLETED."""
    env = fake_scontrol(tmp_path / "bin", script)
    monkeypatch.setenv("PATH", env["PATH"])  # shutil.which looks there
    with pytest.raises(RequeueFailed) as info:
        requeue_after_warning({signal.SIGUSR1}, env)
    message = str(info.value)
    assert f"job was not requeued: {why}. Run `scontrol requeue 4242` by hand" in message
    assert "checkpoint_last is saved" in message and "\n" not in message
    assert not requeue_after_warning({signal.SIGTERM}, env)  # SIGTERM is not ours to requeue: no error


def failed_requeue(data, root, budget):
    """One rank under SLURM whose scontrol fails, stopped by SIGUSR1 once under way."""
    root.mkdir()
    env = dict(os.environ)
    fake = fake_scontrol(root / "bin", "echo 'Requeue not allowed' >&2; exit 1")
    env.update(SLURM_JOB_ID=fake["SLURM_JOB_ID"], PATH=f"{fake['PATH']}{os.pathsep}{env['PATH']}")
    save = root / "ck"
    proc = start_under_way([sys.executable, "-m", "shardtrain.cli.train", data, *tiny_model_flags(),
                            "--disable-validation", "--max-update", "100000", "--cpu", "--save-dir", str(save)],
                           budget, env=env)
    proc.send_signal(signal.SIGUSR1)
    out, err = finish(proc, budget(60))
    return proc, err, save


@pytest.mark.slow
def test_a_failed_requeue_exits_non_zero_after_saving(runs):
    """End to end, one rank: SIGUSR1, checkpoint_last saved, scontrol fails, exit 2 with the paragraph."""
    proc, err, save = runs["failed requeue"].get()
    assert proc.returncode == 2, err[-2000:]
    assert updates_in(save) >= 3  # saved before the requeue was tried
    assert "shard-train: error: SIGUSR1 (SLURM's warning before the time limit) reached job 4242" in err
    assert "`scontrol requeue 4242` failed with exit code 1: Requeue not allowed" in err and "Traceback" not in err
