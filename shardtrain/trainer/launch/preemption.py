"""Preemption: SIGTERM or SIGUSR1 (SLURM's warning before it kills a job) ends
training cleanly. The handler only sets a flag; after the current update every
rank agrees on it (one tiny all-reduce), a checkpoint_last is saved and the job
exits 0, so relaunching the same command resumes where it stopped."""
import contextlib
import os
import signal
import threading

import torch

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionWatcher:
    def __init__(self):
        self.requested = False
        self._previous = {}
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True

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
