"""Preemption: SIGTERM or SIGUSR1 (SLURM's warning before it kills a job) ends
training cleanly. The handler only sets a flag; after the current update every
rank agrees on it (one tiny all-reduce), a checkpoint_last is saved and the job
exits 0, so relaunching the same command resumes where it stopped.

Under SLURM, SIGUSR1 is the warning a job asks for (``sbatch --signal=USR1@90``)
before its time limit: after the save, rank 0 requeues the job (``scontrol requeue``,
as Lightning and submitit do), so it resumes by itself when it runs again. A job
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


def requeue_after_warning(received, env: Mapping[str, str] = os.environ) -> bool:
    """On rank 0, after checkpoint_last is on disk: requeue the SLURM job that SIGUSR1 warned.
    True when it was requeued; a failure is logged with the command to run by hand."""
    job = slurm_job_id(env)
    if signal.SIGUSR1 not in received or job is None:
        return False
    scontrol = shutil.which("scontrol")
    command = f"scontrol requeue {job}"
    if scontrol is None:
        logger.warning(f"SIGUSR1 in SLURM job {job}, but scontrol is not on PATH: the job was not requeued. "
                       f"checkpoint_last is saved; run `{command}` or resubmit the job to resume.")
        return False
    done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True)
    if done.returncode != 0:
        logger.warning(f"`{command}` failed ({(done.stderr or done.stdout).strip()}): the job was not requeued. "
                       "checkpoint_last is saved; resubmit the job to resume (sbatch --requeue lets a job be "
                       "requeued).")
        return False
    logger.info(f"requeued SLURM job {job} ({command}): it resumes from checkpoint_last when it runs again")
    return True


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
