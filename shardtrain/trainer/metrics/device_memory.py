"""Accelerator memory for log records: fairseq's ``gb_free`` and the peaks behind it.

fairseq (trainer.py, train_step) logs ``gb_free = total - max_memory_allocated()``
and resets the allocator's peak after every update; its meter has weight 0, so
a record shows the *last update's* peak. Here the peak is taken over each
record's whole window, so a spike anywhere in a --log-interval window shows.

The allocator keeps one peak per device. Every read resets it once, and the
reading is folded into a running maximum per record tag, so the reset made for
one record loses nothing for another: the epoch's ``train`` record carries the
maximum over all the ``train_inner`` and ``valid`` windows inside its epoch.
"""
from dataclasses import dataclass
from functools import partial
from typing import Callable, Dict, Iterable, Optional

import torch

GIB = 2**30
ROUND = 3  # GiB to 3 decimals: about 1 MiB, so even a tiny test model's peak is above 0


@dataclass(frozen=True)
class MemoryCalls:
    """One device's allocator calls, in bytes; tests pass stand-ins."""

    max_allocated: Callable[[], int]
    max_reserved: Callable[[], int]
    reserved: Callable[[], int]
    reset_peak: Callable[[], None]
    total: Callable[[], int]


def accelerator_memory(device: torch.device) -> Optional[MemoryCalls]:
    """torch.cuda's (torch.xpu's, ...) calls bound to ``device``; None on the CPU or
    where the device's torch module lacks them."""
    module = getattr(torch, device.type, None) if device.type != "cpu" else None
    names = ("max_memory_allocated", "max_memory_reserved", "memory_reserved", "reset_peak_memory_stats",
             "mem_get_info")
    if module is None or not all(hasattr(module, n) for n in names):
        return None
    return MemoryCalls(max_allocated=partial(module.max_memory_allocated, device),
                       max_reserved=partial(module.max_memory_reserved, device),
                       reserved=partial(module.memory_reserved, device),
                       reset_peak=partial(module.reset_peak_memory_stats, device),
                       total=lambda: module.mem_get_info(device)[1])


class PeakWindows:
    """The device's peak allocated and reserved bytes per tag, since that tag's
    previous :meth:`record` (or :meth:`restart`)."""

    def __init__(self, calls: MemoryCalls, tags: Iterable[str]):
        self.calls = calls
        self.alloc = dict.fromkeys(tags, 0)
        self.peak_reserved = dict.fromkeys(tags, 0)

    def restart(self, tag: str) -> None:
        """Start ``tag``'s window now (validation: its record shows validation alone)."""
        self._read()
        self.alloc[tag] = self.peak_reserved[tag] = 0

    def record(self, tag: str) -> Dict[str, float]:
        """``tag``'s figures in GiB; its next window starts now."""
        self._read()
        alloc, peak_reserved = self.alloc[tag], self.peak_reserved[tag]
        self.alloc[tag] = self.peak_reserved[tag] = 0
        figures = {"gb_free": self.calls.total() - alloc, "gb_peak_alloc": alloc,
                   "gb_reserved": self.calls.reserved(), "gb_peak_reserved": peak_reserved}
        return {k: round(v / GIB, ROUND) for k, v in figures.items()}

    def peak_alloc(self, tag: str) -> int:
        """``tag``'s peak allocated bytes so far, its window left running."""
        self._read()
        return self.alloc[tag]

    def _read(self) -> None:
        alloc, reserved = self.calls.max_allocated(), self.calls.max_reserved()
        self.calls.reset_peak()  # once per read: the next read sees only what came after
        for tag in self.alloc:
            self.alloc[tag] = max(self.alloc[tag], alloc)
            self.peak_reserved[tag] = max(self.peak_reserved[tag], reserved)
