"""``--skip-batches``: windows of an epoch's batches that training passes over.

A window is ``EPOCH:FIRST-LAST``: this rank's batches FIRST to LAST (1-based, inclusive, counted
from the epoch's start as the data iterator yields them) of epoch EPOCH, on every rank. It is what
a ``--spike-rollback`` log line names as skipped and what a checkpoint's ``spike_guard`` records,
so a run can be replayed without the batches an earlier run rolled back, or a person can skip the
data before a spike by hand, as the OPT and PaLM logbooks did.
"""
import re
from typing import Iterable, List, Tuple

from shardtrain.core.errors import ConfigError

Window = Tuple[int, int, int]  # (epoch, first batch, last batch)

_WINDOW = re.compile(r"^\s*(\d+):(\d+)-(\d+)\s*$")


def parse_windows(text: str) -> List[Window]:
    """``"2:121-140,3:5-9"`` -> ``[(2, 121, 140), (3, 5, 9)]``; a one-paragraph error otherwise."""
    windows = []
    for part in filter(str.strip, (text or "").split(",")):
        match = _WINDOW.match(part)
        if not match or int(match.group(1)) < 1 or not 1 <= int(match.group(2)) <= int(match.group(3)):
            raise ConfigError(
                f"--skip-batches: {part.strip()!r} is not a window. Give EPOCH:FIRST-LAST, comma-separated, "
                "with epochs from 1 and batches counted from 1 within the epoch, FIRST <= LAST (for example "
                "--skip-batches 2:121-140,3:5-9: the form a --spike-rollback log line names what it skipped).")
        windows.append((int(match.group(1)), int(match.group(2)), int(match.group(3))))
    return windows


def format_windows(windows: Iterable[Window]) -> str:
    return ",".join(f"{e}:{a}-{b}" for e, a, b in windows)


class BatchWindows:
    def __init__(self, windows: Iterable[Window]):
        self.windows = list(windows)

    def covers(self, epoch: int, first: int, last: int) -> bool:
        """True when an update made of batches ``first..last`` of ``epoch`` touches a window
        (the whole update is skipped: its batches are one step)."""
        return any(e == epoch and a <= last and first <= b for e, a, b in self.windows)
