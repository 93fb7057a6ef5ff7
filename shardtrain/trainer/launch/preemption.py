"""Preemption: SIGTERM or SIGUSR1 (SLURM's warning before it kills a job) ends
training cleanly. The handler only sets a flag; after the current update every
rank agrees on it (one tiny all-reduce), a checkpoint_last is saved and the job
exits 0, so relaunching the same command resumes where it stopped.

Under SLURM, SIGUSR1 is the warning a job asks for (``sbatch --signal=USR1@90``)
before its time limit: after the save, rank 0 requeues the job (``scontrol requeue``,
as Lightning and submitit do), so it resumes by itself when it runs again; if it cannot, the
command exits non-zero with the command to run by hand. A job
that exits 0 after the warning would otherwise end COMPLETED, and nobody restarts
it. SIGTERM (scancel, or a preemption SLURM requeues itself) is not requeued by us.
"""
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
from typing import Mapping, Optional

import torch

from shardtrain.core.errors import ShardtrainError

logger = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionWatcher:
    def __init__(self):
        self.requested = False
        self.received = set()  # the signals seen
        self._previous = {}
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self.received.add(signum)

    def agreed(self, backend, also: bool = False) -> bool:
        """True on every rank if any rank was signalled or passes ``also`` (another local
        reason to stop, e.g. its own clock past --stop-time-hours); ranks see signals and
        clocks at different moments, and must stop after the same update."""
        local = self.requested or also
        if backend.world_size == 1:
            return local
        flag = torch.tensor([1.0 if local else 0.0], device=backend.device)
        return bool(backend.all_reduce_sum(flag).item() > 0)

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def slurm_job_id(env: Mapping[str, str]) -> Optional[str]:
    """The id ``scontrol requeue`` takes: an array task's own ``JOB_TASK`` form, else SLURM_JOB_ID."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


class RequeueFailed(ShardtrainError):
    """SIGUSR1 asked for a requeue that did not happen: the command exits non-zero, so that SLURM
    records the job as failed (not COMPLETED) and whoever watches it resubmits."""


def requeue_after_warning(received, env: Mapping[str, str] = os.environ) -> bool:
    """On rank 0, after checkpoint_last is on disk: requeue the SLURM job that SIGUSR1 warned.
    True when it was requeued, False when there was nothing to requeue; raises RequeueFailed (with
    the command to run by hand) when scontrol is missing or fails."""
    job = slurm_job_id(env)
    if signal.SIGUSR1 not in received or job is None:
        return False
    scontrol = shutil.which("scontrol")
    command = f"scontrol requeue {job}"
    if scontrol is None:
        raise RequeueFailed(_not_requeued(job, "scontrol is not on PATH", command))
    done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True)
    if done.returncode != 0:
        why = f"`{command}` failed with exit code {done.returncode}: {(done.stderr or done.stdout).strip()}"
        raise RequeueFailed(_not_requeued(job, why, command))
    logger.info(f"requeued SLURM job {job} ({command}): it resumes from checkpoint_last when it runs again")
    return True


def _not_requeued(job: str, why: str, command: str) -> str:
    return (f"SIGUSR1 (SLURM's warning before the time limit) reached job {job}; checkpoint_last is saved, but the "
            f"job was not requeued: {why}. Run `{command}` by hand (a job submitted without --requeue cannot be "
            "requeued: resubmit it instead); the same command resumes from checkpoint_last. This exit is non-zero "
            "so that SLURM does not record the job as completed.")


@contextlib.contextmanager
def forwarding_signals(processes):
    """In a launcher that spawned the ranks: pass SIGTERM/SIGUSR1 on to every rank,
    which then saves checkpoint_last and exits 0, instead of dying and orphaning them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum, frame):
        for process in processes:
            if process.is_alive():
                os.kill(process.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
