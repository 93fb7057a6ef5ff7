"""SIGTERM/SIGUSR1: finish the update, save checkpoint_last, exit 0; relaunching resumes."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from shardtrain.trainer.launch.preemption import (PreemptionWatcher, RequeueFailed, requeue_after_warning,
                                                  slurm_job_id)
from st_testutils import last_checkpoint_state, make_space_data_bin, scaled, tiny_model_flags


@pytest.mark.slow
@pytest.mark.parametrize("sig,ranks,slurm", [(signal.SIGTERM, 1, True), (signal.SIGUSR1, 2, True)])
def test_signal_saves_and_exits_zero_then_resumes(sig, ranks, slurm, tmp_path):
    """Under SLURM (SLURM_JOB_ID; scontrol is a stand-in that records its arguments), SIGUSR1 (the
    time-limit warning) also requeues the job once checkpoint_last is saved; SIGTERM does not."""
    data = make_space_data_bin(str(tmp_path), n_words=8, train_tokens=20000, valid_tokens=200, line_len=40)
    env, calls = dict(os.environ), tmp_path / "scontrol-calls"
    if slurm:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
        (bin_dir / "scontrol").chmod(0o755)
        env.update(SLURM_JOB_ID="4242", PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    save = tmp_path / "ck"
    command = [sys.executable, "-m", "shardtrain.cli.train", data, "--arch", "transformer_lm", "--decoder-layers",
               "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2",
               "--tokens-per-sample", "32", "--batch-size", "4", "--disable-validation", "--max-update", "100000",
               "--cpu", "--threads", "1", "--log-format", "json", "--log-interval", "1", "--save-dir", str(save),
               "--distributed-world-size", str(ranks), "--ddp-backend", "fully_sharded" if ranks > 1 else "c10d"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    for line in proc.stdout:  # wait until training is under way
        if '"num_updates": "3"' in line or time.time() > deadline:
            break
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    stopped_at = updates_in(save)
    assert stopped_at >= 3
    requeued = calls.read_text() if calls.exists() else ""
    assert requeued == ("requeue 4242\n" if slurm and sig == signal.SIGUSR1 else ""), (requeued, err[-2000:])
    resumed = subprocess.run(command[:command.index("100000")] + [str(stopped_at + 2)]
                             + command[command.index("100000") + 1:], capture_output=True, text=True, timeout=120,
                             env=env)
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


@pytest.mark.slow
def test_a_failed_requeue_exits_non_zero_after_saving(tmp_path):
    """End to end, one rank: SIGUSR1, checkpoint_last saved, scontrol fails, exit 2 with the paragraph."""
    data = make_space_data_bin(str(tmp_path), n_words=8, train_tokens=20000, valid_tokens=200, line_len=40)
    env = dict(os.environ)
    fake = fake_scontrol(tmp_path / "bin", "echo 'Requeue not allowed' >&2; exit 1")
    env.update(SLURM_JOB_ID=fake["SLURM_JOB_ID"], PATH=f"{fake['PATH']}{os.pathsep}{env['PATH']}")
    save = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, "-m", "shardtrain.cli.train", data, *tiny_model_flags(),
                             "--disable-validation", "--max-update", "100000", "--cpu", "--save-dir", str(save)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + scaled(60)
    for line in proc.stdout:  # wait until training is under way
        if '"num_updates": "3"' in line or time.time() > deadline:
            break
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=scaled(60))
    assert proc.returncode == 2, err[-2000:]
    assert updates_in(save) >= 3  # saved before the requeue was tried
    assert "shard-train: error: SIGUSR1 (SLURM's warning before the time limit) reached job 4242" in err
    assert "`scontrol requeue 4242` failed with exit code 1: Requeue not allowed" in err and "Traceback" not in err
