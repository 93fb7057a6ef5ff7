"""In-memory stand-ins for the data-bin reader, for the data pipeline tests."""
from typing import List, Sequence

import numpy as np

PAD = 1
EOS = 2


class FakeIndexedDataset:
    """Same interface as ``MMapIndexedDataset``: ``sizes``, ``len``, ``[i]``.

    Lines are stored as uint16 like a small-vocabulary data-bin. ``reads``
    records every line index read, to check that blocks read only the lines
    they span.
    """

    def __init__(self, lines: Sequence[Sequence[int]]):
        self._lines = [np.asarray(line, dtype=np.uint16) for line in lines]
        self.sizes = np.array([len(line) for line in self._lines], dtype=np.int32)
        self.reads: List[int] = []

    def __len__(self) -> int:
        return len(self._lines)

    def __getitem__(self, i: int) -> np.ndarray:
        self.reads.append(int(i))
        return self._lines[i].copy()


def lines_with_sizes(sizes: Sequence[int], seed: int = 0) -> List[List[int]]:
    """Random lines of the given lengths, each ending with EOS (size 1 = empty line)."""
    rng = np.random.RandomState(seed)
    return [list(rng.randint(4, 100, size=n - 1)) + [EOS] for n in sizes]


class CountingDataset:
    """``dataset[i] == i``, recording reads; for iterator tests."""

    def __init__(self, n: int):
        self.n = n
        self.reads: List[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.reads.append(int(i))
        return int(i)


def list_collate(samples: List[int]):
    """Collate for ``CountingDataset``: the sample ids, or ``{}`` when empty."""
    return list(samples) if samples else {}
