"""What a multi-rank start waits for, said while it waits.

Spawning N ranks on one machine takes seconds to minutes before the first training line: each process
imports torch, then every rank waits at the rendezvous until all have joined the process group. The
launching process says so when it starts them, when each rank has started and joined, and every
``every_s`` seconds while nothing changes, naming the ranks still awaited. The lines go to stderr and
are flushed, so they arrive through a pipe too (python buffers a pipe until exit otherwise). A rank
marks each step with an empty file in the run directory, which the launcher polls.
"""
import logging
import os
import sys
import time
from typing import Callable, List, Optional, TextIO

from shardtrain.trainer.metrics.logging_setup import DATE_FORMAT, FORMAT

STEPS = ("started", "joined")  # the rank's process runs (torch imported); it is in the process group


def mark(run_dir: str, step: str, rank: int) -> None:
    with open(os.path.join(run_dir, f"{step}-rank{rank}"), "w"):
        pass


def _marked(run_dir: str, step: str, world_size: int) -> List[int]:
    return [r for r in range(world_size) if os.path.exists(os.path.join(run_dir, f"{step}-rank{r}"))]


class StartWatch:
    """Polled by the launcher until every rank has joined; ``done`` then stops the polling."""

    def __init__(self, run_dir: str, world_size: int, backend: str, stream: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic, every_s: float = 10.0, forked: bool = False):
        """``forked``: the ranks are forked from one process that imports torch for them (start_method.py)."""
        self.run_dir, self.world_size, self.backend, self.forked = run_dir, world_size, backend, forked
        self.clock, self.every_s = clock, every_s
        self.started_at = self.last_line_at = clock()
        self.seen = {step: 0 for step in STEPS}
        self.done = False
        self.logger = _logger(stream or sys.stderr)

    def begin(self, init_method: str) -> None:
        where = "a file in a temporary directory" if init_method.startswith("file://") else init_method
        how = ("one process imports torch and the ranks are forked from it" if self.forked else
               "each process imports torch")
        self._say(f"starting {self.world_size} ranks on this machine ({self.backend}): {how}, then they meet "
                  f"through {where}; waiting for them")

    def warn(self, text: str) -> None:
        self.logger.warning(text)

    def poll(self) -> None:
        started = _marked(self.run_dir, "started", self.world_size)
        joined = _marked(self.run_dir, "joined", self.world_size)
        now, waited = self.clock(), self.clock() - self.started_at
        if len(joined) == self.world_size:
            self.done = True
            self._say(f"all {self.world_size} ranks joined the process group after {waited:.1f} s")
        elif (len(started), len(joined)) != (self.seen["started"], self.seen["joined"]) \
                or now - self.last_line_at >= self.every_s:
            self._say(self._waiting_for(started, joined, waited))
        self.seen = {"started": len(started), "joined": len(joined)}

    def _waiting_for(self, started: List[int], joined: List[int], waited: float) -> str:
        if len(started) < self.world_size:
            missing = [r for r in range(self.world_size) if r not in started]
            return (f"{len(started)} of {self.world_size} ranks started after {waited:.0f} s; waiting for "
                    f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} to import torch and start")
        missing = [r for r in range(self.world_size) if r not in joined]
        return (f"{len(joined)} of {self.world_size} ranks in the process group after {waited:.0f} s; waiting at "
                f"the rendezvous for rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}")

    def _say(self, text: str) -> None:
        self.last_line_at = self.clock()
        self.logger.info(text)


def _logger(stream: TextIO) -> logging.Logger:
    """Its own handler (the launching process sets up no logging: its ranks log for the run)."""
    logger = logging.Logger(__name__, logging.INFO)  # not in the manager: nothing else gets its records
    handler = logging.StreamHandler(stream)  # it flushes every record
    handler.setFormatter(logging.Formatter(FORMAT, datefmt=DATE_FORMAT))
    logger.addHandler(handler)
    return logger

