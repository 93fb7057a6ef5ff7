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

Ctrl-C (SIGINT) stops the same way: the first finishes the update and saves checkpoint_last;
a second (or a SIGINT after SIGTERM/SIGUSR1) raises KeyboardInterrupt at once. A validation under way
stops at its next batch (validation.py); the partial pass is not recorded.

Ranks that shard-train spawned count the presses their launcher passes on (``PASSED_ON``), never their own
SIGINT while the launcher lives. A terminal's Ctrl-C reaches the launcher and every rank (one process group);
``kill -INT <launcher>`` reaches the launcher alone. Only the launcher sees every press in both cases, so it
counts them. A rank that counted its own SIGINT as well could not tell the launcher's pass-on of the first
press from a second press: the two arrive in either order (the kernel hands each signal to whichever of the
rank's threads runs first), and a rank that met the pass-on first stopped at once, its save lost (seen twice
under load, 2026-12-03). A rank whose parent has ended counts its own SIGINT again: that is the parent-death
signal torch.multiprocessing sets, the launcher's last word.

Until every spawned rank has joined the process group nothing can be saved: Ctrl-C or SIGTERM to the
launcher then stops the ranks at once and the command answers as for any signal (one line, exit
128 + signal: 130 / 143), rather than reporting ranks killed by the SIGTERM it sent them.
"""
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
from typing import Callable, Mapping, Optional

import torch

from shardtrain.core.errors import ShardtrainError

logger = logging.getLogger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
# Each Ctrl-C a launcher passes on to the ranks it spawned (module docstring): a signal nobody else sends them.
PASSED_ON = signal.SIGUSR2
# What shard-train's one-line exit after a second Ctrl-C (or SIGTERM while starting) says is true.
STOPPED_AT_ONCE = ("nothing newer than the last checkpoint in --save-dir was saved (a first Ctrl-C finishes the "
                   "update and saves); the same command resumes from that checkpoint, or starts afresh without one")
FIRST_CTRL_C = ("Ctrl-C: finishing the current update (or validation batch), then saving checkpoint_last "
                "(press Ctrl-C again to stop at once, without saving)")


class PreemptionWatcher:
    """``announce``: say at once what the first Ctrl-C does (a single process; a launcher says it for its ranks).
    ``led``: a rank shard-train's launcher spawned, which counts the presses the launcher passes on instead of its
    own SIGINT (module docstring)."""

    def __init__(self, announce: bool = False, led: bool = False):
        self.requested = False
        self.received = set()  # the signals seen (a press passed on is recorded as SIGINT)
        self.interrupted = False  # after agreed(): whether any rank had a Ctrl-C
        self._announce = announce
        self._stopping_now = False
        self._previous = {}
        self._parent = os.getppid() if led else None
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._own_interrupt if led else
                                                          self._interrupt)
            if led:
                self._previous[PASSED_ON] = signal.signal(PASSED_ON, self._interrupt)

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self.received.add(signum)

    def _own_interrupt(self, signum, frame) -> None:
        if os.getppid() == self._parent:  # the launcher lives: it passes this press on
            return
        self._interrupt(signum, frame)

    def _interrupt(self, signum, frame) -> None:
        signum = signal.SIGINT  # a press passed on is a Ctrl-C
        if self._stopping_now:  # a press after the one that stops at once: its clean-up is under way
            return
        if self.requested:  # a second Ctrl-C, or one after SIGTERM: the user will not wait for the save
            self._stopping_now = True
            raise KeyboardInterrupt
        self._handle(signum, frame)
        if self._announce:  # os.write: a handler may run inside a print or a logging call
            os.write(2, f"\n{FIRST_CTRL_C}\n".encode())

    def agreed(self, backend, also: bool = False) -> bool:
        """True on every rank if any rank was signalled or passes ``also`` (another local
        reason to stop, e.g. its own clock past --stop-time-hours); ranks see signals and
        clocks at different moments, and must stop after the same update. Sets ``interrupted``."""
        local = [1.0 if self.requested or also else 0.0, 1.0 if signal.SIGINT in self.received else 0.0]
        if backend.world_size > 1:
            local = backend.all_reduce_sum(torch.tensor(local, device=backend.device)).tolist()
        self.interrupted = local[1] > 0
        return local[0] > 0

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


def stopped_message(interrupted: bool, updates: int, no_save: bool, save_dir: str) -> str:
    """What rank 0 says last after a stop by a signal (``interrupted``: a Ctrl-C)."""
    why = "Ctrl-C" if interrupted else "SIGTERM/SIGUSR1"
    if no_save:
        return f"stopped by {why} at update {updates}; nothing was saved (--no-save)"
    return (f"stopped by {why} at update {updates} with checkpoint_last saved: the same command resumes "
            f"from it (in --save-dir {save_dir})")


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


class StoppedWhileStarting(BaseException):
    """Ctrl-C or SIGTERM reached the launcher before every rank had joined: there is nothing to save yet, so
    the launcher stops the ranks and then answers the signal as any command does (cli: one line, 128 + signal).
    A BaseException, like KeyboardInterrupt: no ``except Exception`` on the way out swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def answer_signal(signum: int) -> None:
    """Raise ``signum`` again in this process, once its handlers are the caller's again (the command's
    answer: KeyboardInterrupt for SIGINT, cli's one line for SIGTERM, else the default: death by the signal)."""
    signal.raise_signal(signum)
    raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)  # the signal was ignored


@contextlib.contextmanager
def forwarding_signals(processes, starting: Callable[[], bool] = lambda: False):
    """In a launcher that spawned the ranks: pass SIGTERM/SIGUSR1 on to every rank,
    which then saves checkpoint_last and exits 0, instead of dying and orphaning them.
    Ctrl-C: each press is passed on as ``PASSED_ON`` (see the module's docstring); after the second the launcher
    stops waiting (KeyboardInterrupt: its clean-up ends the ranks).

    While ``starting()`` (not every rank has joined: none can save yet) Ctrl-C or SIGTERM raises
    StoppedWhileStarting instead (the ranks are sent SIGTERM first), once ``processes`` (a list the
    launcher fills after starting them) is not empty: a signal that comes while they are being started
    is raised by ``.check()``, which the launcher calls once the list is full."""
    state = _Forwarding(processes)
    if threading.current_thread() is not threading.main_thread():
        yield state
        return
    interrupts = []

    def forward(signum, frame, as_signal=None):
        for process in processes:
            if process.is_alive():
                os.kill(process.pid, as_signal or signum)

    def on_signal(signum, frame):
        if signum == signal.SIGTERM and starting():
            state.stop(signum)
            return
        forward(signum, frame)

    def interrupt(signum, frame):
        interrupts.append(signum)
        if starting() and len(interrupts) == 1:
            state.stop(signum)
            return
        forward(signum, frame, as_signal=PASSED_ON)  # every press: the ranks count them (module docstring)
        if len(interrupts) > 1:
            raise KeyboardInterrupt
        os.write(2, f"\n{FIRST_CTRL_C}\n".encode())

    previous = {sig: signal.signal(sig, on_signal) for sig in SIGNALS}
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, interrupt)
    try:
        yield state
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Forwarding:
    """The launcher's side of a stop while its ranks start (see forwarding_signals)."""

    def __init__(self, processes):
        self.processes = processes
        self.stopped: Optional[int] = None  # the signal that stopped the start

    def stop(self, signum: int) -> None:
        self.stopped = signum
        self.check()

    def check(self) -> None:
        """Raise StoppedWhileStarting if a signal stopped the start, once the ranks can be stopped."""
        if self.stopped is None or not self.processes:
            return
        for process in self.processes:  # they die at once: none has a handler before it trains
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)
        raise StoppedWhileStarting(self.stopped)
