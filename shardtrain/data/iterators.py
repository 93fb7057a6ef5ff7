"""Epoch iterator over collated batches, sharded per rank and resumable.

Follows fairseq 0.12's ``EpochBatchIterator``: the batches are fixed, their
order is shuffled per epoch with ``RandomState(seed + epoch)``, rank
``shard_id`` takes every ``num_shards``-th batch, and short shards end with
an empty ``{}`` batch so all ranks run the same number of steps.
"""
import math
import queue
import threading
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Union

import numpy as np

from shardtrain.core.errors import CheckpointError, DataError

BatchSampler = Union[Sequence[np.ndarray], Callable[[int], Sequence[np.ndarray]]]
_EMPTY_BATCH = np.zeros(0, dtype=np.int64)


class CountingIterator:
    """Wraps an iterator and counts the items consumed (``n``) out of ``len``."""

    def __init__(self, iterable: Iterable, start: int, total: int):
        self._itr = iter(iterable)
        self.n = start
        self.total = total

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> "CountingIterator":
        return self

    def __next__(self):
        if not self.has_next():
            raise StopIteration
        item = next(self._itr)
        self.n += 1
        return item

    def has_next(self) -> bool:
        return self.n < self.total


class BufferedIterator:
    """Prefetches up to ``size`` items of ``iterable`` in a background thread.

    Order is unchanged. The thread starts at the first ``next`` so that an
    iterator that is never consumed costs nothing.
    """

    _DONE = object()

    def __init__(self, iterable: Iterable, size: int):
        self._iterable = iterable
        self._queue: "queue.Queue" = queue.Queue(maxsize=size)
        self._thread: Optional[threading.Thread] = None

    def _fill(self) -> None:
        try:
            for item in self._iterable:
                self._queue.put(item)
            self._queue.put(self._DONE)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._queue.put(exc)

    def __iter__(self) -> "BufferedIterator":
        return self

    def __next__(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._fill, daemon=True)
            self._thread.start()
        item = self._queue.get()
        if item is self._DONE:
            self._queue.put(item)  # keep answering StopIteration
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item


class EpochBatchIterator:
    """Yields collated batches of ``dataset`` epoch by epoch for one rank.

    ``batch_sampler`` is a list of index arrays, or a function of the epoch
    returning one. ``shuffle=False`` never shuffles the batch order.
    """

    def __init__(self, dataset, collate_fn: Callable[[List], dict], batch_sampler: BatchSampler,
                 seed: int = 1, num_shards: int = 1, shard_id: int = 0, epoch: int = 1,
                 shuffle: bool = True, buffer_size: int = 0):
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard_id must be in [0, {num_shards}), got {shard_id}")
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.seed = seed
        self.num_shards = num_shards
        self.shard_id = shard_id
        self.epoch = max(epoch, 1)  # epochs count from 1, as in fairseq
        self.shuffle = shuffle
        self.buffer_size = buffer_size
        self._allow_shuffle = shuffle
        self._batch_sampler = batch_sampler if callable(batch_sampler) else None
        self._batches = [] if callable(batch_sampler) else [np.asarray(b, dtype=np.int64) for b in batch_sampler]
        self._batches_epoch: Optional[int] = None  # the epoch the sampler last made _batches for
        self._cur_itr: Optional[CountingIterator] = None
        self._next_itr: Optional[CountingIterator] = None
        self._next_shuffle = shuffle

    def _batches_for(self, epoch: int) -> List[np.ndarray]:
        if self._batch_sampler is not None and self._batches_epoch != epoch:
            self._batches = [np.asarray(b, dtype=np.int64) for b in self._batch_sampler(epoch)]
            self._batches_epoch = epoch
        return self._batches

    def _shard_batches(self, epoch: int, shuffle: bool) -> List[np.ndarray]:
        """This rank's batches for ``epoch``, padded with empty batches."""
        batches = self._batches_for(epoch)
        order = np.arange(len(batches))
        if shuffle:
            # Shuffling positions draws the same swaps as fairseq's
            # np.random.shuffle(list_of_batches) under numpy_seed(seed + epoch).
            np.random.RandomState(self.seed + epoch).shuffle(order)
        mine = [batches[i] for i in order[self.shard_id::self.num_shards]]
        return mine + [_EMPTY_BATCH] * (self._shard_len(len(batches)) - len(mine))

    def _shard_len(self, num_batches: int) -> int:
        return math.ceil(num_batches / self.num_shards)

    def _collated(self, batches: List[np.ndarray]) -> Iterator[dict]:
        for batch in batches:
            yield self.collate_fn([self.dataset[int(i)] for i in batch])

    def _make_itr(self, epoch: int, shuffle: bool, offset: int) -> CountingIterator:
        batches = self._shard_batches(epoch, shuffle)
        itr: Iterable = self._collated(batches[offset:])  # skipped batches are never read
        if self.buffer_size > 0:
            itr = BufferedIterator(itr, self.buffer_size)
        return CountingIterator(itr, start=offset, total=len(batches))

    def __len__(self) -> int:
        """Batches per rank in the current epoch (filler included)."""
        return self._shard_len(len(self._batches_for(self.epoch)))

    @property
    def first_batch(self) -> dict:
        """The epoch's first batch, collated: a stand-in for the model to run
        on an empty filler step (with its loss weighted by zero)."""
        batches = self._batches_for(self.epoch)
        if not batches:
            raise DataError(
                "the dataset gives no batches: it is empty, or every sample was filtered out "
                "as too long; use more data, or raise --max-tokens / --tokens-per-sample."
            )
        return self.collate_fn([self.dataset[int(i)] for i in batches[0]])

    @property
    def next_epoch_idx(self) -> int:
        """The epoch that the next :meth:`next_epoch_itr` call iterates."""
        if self._next_itr is not None:
            return self.epoch
        if self._cur_itr is not None and self.end_of_epoch():
            return self.epoch + 1
        return self.epoch

    def next_epoch_itr(self, shuffle: bool = True) -> CountingIterator:
        """The iterator for the next epoch, or the rest of a resumed one."""
        self.epoch = self.next_epoch_idx
        if self._next_itr is not None:
            self._cur_itr, self._next_itr = self._next_itr, None
            self.shuffle = self._next_shuffle
        else:
            self.shuffle = shuffle and self._allow_shuffle
            self._cur_itr = self._make_itr(self.epoch, self.shuffle, offset=0)
        return self._cur_itr

    def end_of_epoch(self) -> bool:
        """Whether the current epoch's iterator is exhausted."""
        return self._cur_itr is not None and not self._cur_itr.has_next()

    @property
    def iterations_in_epoch(self) -> int:
        """Batches consumed by this rank in the current epoch."""
        if self._cur_itr is not None:
            return self._cur_itr.n
        if self._next_itr is not None:
            return self._next_itr.n
        return 0

    def state_dict(self) -> dict:
        if self.end_of_epoch():
            epoch, done = self.epoch + 1, 0
        else:
            epoch, done = self.epoch, self.iterations_in_epoch
        # Ranks advance in lockstep over interleaved shards, so after ``done``
        # steps the first ``done * num_shards`` batches of the epoch's order
        # are consumed (mid-epoch this never reaches the filler).
        return {"epoch": epoch, "iterations_in_epoch": done, "shuffle": self.shuffle,
                "num_shards": self.num_shards, "global_batches_done": done * self.num_shards}

    def load_state_dict(self, state_dict: dict) -> None:
        """Make the next :meth:`next_epoch_itr` continue where ``state_dict`` stopped.

        With a different ``num_shards`` the saved position is the global batch
        ``global_batches_done`` of the epoch's shuffled order; each rank
        resumes at step ``global_batches_done // num_shards`` of its own shard.
        That rounds down: up to ``num_shards - 1`` batches before the saved
        point are trained on again, none is skipped.
        """
        self.epoch = state_dict["epoch"]
        done = state_dict.get("iterations_in_epoch", 0)
        saved_shards = state_dict.get("num_shards", self.num_shards)
        if saved_shards != self.num_shards:
            done = state_dict.get("global_batches_done", done * saved_shards) // self.num_shards
        self._next_shuffle = state_dict.get("shuffle", True) and self._allow_shuffle
        self.shuffle = self._next_shuffle
        self._cur_itr = None
        self._next_itr = None
        if done > 0:
            if done >= len(self):
                raise CheckpointError(
                    f"the checkpoint resumes epoch {self.epoch} after {done} batches per rank, but "
                    f"this epoch has only {len(self)}: the data or the batch-size flags changed "
                    "since it was saved; restore them, or restart the data iterator from the "
                    "beginning of the epoch (--reset-dataloader)."
                )
            self._next_itr = self._make_itr(self.epoch, self._next_shuffle, offset=done)
