"""``--skip-batches``: windows of an epoch's batches that training passes over.

A window is ``EPOCH:FIRST-LAST``: this rank's batches FIRST to LAST (1-based, inclusive, counted
from the epoch's start as the data iterator yields them) of epoch EPOCH, on every rank. It is what
a ``--spike-rollback`` log line names as skipped and what a checkpoint's ``spike_guard`` records,
so a run can be replayed without the batches an earlier run rolled back, or a person can skip the
data before a spike by hand, as the OPT and PaLM logbooks did.
"""
import re
from typing import Iterable, List, Set, Tuple

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


def format_batches(batches: List[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5,9"``."""
    runs: List[List[int]] = []
    for b in batches:
        if runs and b == runs[-1][1] + 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


class BatchWindows:
    """The run's windows. Each batch a window names is passed over, and only those: with --update-freq
    above 1 an update whose batches a window covers in part trains on the rest (a smaller update, as
    an epoch's last one can be), and one it covers whole is skipped. A window that matches no batch is
    named in a warning (at the end of its epoch, or of the run), and so is an epoch that trained nothing
    because every batch of it was passed over: a typo in a window must not pass silently."""

    def __init__(self, windows: Iterable[Window]):
        self.windows = list(windows)
        self._settled: Set[Window] = set()  # windows that matched, or were reported or lay before a resume
        self._epoch_batches = self._epoch_skipped = 0

    def covers(self, epoch: int, first: int, last: int) -> bool:
        """True when batches ``first..last`` of ``epoch`` touch a window."""
        return any(e == epoch and a <= last and first <= b for e, a, b in self.windows)

    def skip(self, epoch: int, first: int, last: int) -> List[int]:
        """Which of batches ``first..last`` of ``epoch`` (one update's) a window names: to pass over."""
        skipped = [batch for batch in range(first, last + 1) if self.covers(epoch, batch, batch)]
        self._settled.update(w for w in self.windows if w[0] == epoch and w[1] <= last and first <= w[2])
        self._epoch_batches += last - first + 1
        self._epoch_skipped += len(skipped)
        return skipped

    def begin_epoch(self, epoch: int, start: int) -> None:
        """Training enters ``epoch`` after ``start`` of its batches (more than 0 when resumed): windows
        of earlier epochs, or before ``start``, were this run's to skip no more."""
        self._settled.update(w for w in self.windows if w[0] < epoch or (w[0] == epoch and w[2] <= start))
        self._epoch_batches = self._epoch_skipped = 0

    def end_epoch(self, epoch: int, total: int) -> List[str]:
        """Warnings at the end of ``epoch``, which has ``total`` batches on each rank."""
        missed = [w for w in self.windows if w[0] == epoch and w not in self._settled]
        self._settled.update(w for w in self.windows if w[0] == epoch)
        warnings = []
        if missed:
            warnings.append(f"--skip-batches {format_windows(missed)} matched no batch: epoch {epoch} has {total} "
                            "batches on each rank (counted from 1 within the epoch), so nothing was skipped for "
                            f"{'it' if len(missed) == 1 else 'them'}. Check the window's epoch and numbers.")
        if self._epoch_batches and self._epoch_skipped == self._epoch_batches:
            named = format_windows(w for w in self.windows if w[0] == epoch)
            warnings.append(f"epoch {epoch} trained nothing: --skip-batches {named} passed over every one of its "
                            f"{self._epoch_batches} batches this run reached (on each rank).")
        return warnings

    def end_run(self, updates: int) -> List[str]:
        """Warnings when training stops after ``updates`` updates: the windows it never reached."""
        missed = [w for w in self.windows if w not in self._settled]
        self._settled.update(missed)
        if not missed:
            return []
        return [f"--skip-batches {format_windows(missed)} matched no batch: training stopped at update {updates} "
                "before reaching them, so nothing was skipped for them."]
