"""Text file -> ``<prefix>.bin/.idx``, and symbol counting for the dictionary.

Both split the file into byte ranges on line boundaries (fairseq's
``find_offsets``), process the ranges in worker processes, and combine the
results in file order, so the output is identical for any number of workers.
Each input line becomes one item: its symbols' ids followed by ``</s>`` (an
empty line gives an item holding just ``</s>``), as fairseq-preprocess does.
"""
import dataclasses
import logging
import multiprocessing
import os
import re
import sys
from collections import Counter
from typing import Callable, Iterator, List, Optional

from tqdm import tqdm

from shardtrain.data.dictionary import Dictionary
from shardtrain.data.indexed_dataset import (MMapIndexedDatasetBuilder, best_fitting_int_dtype, data_file_path,
                                             index_file_path)
from shardtrain.fileio import temp_sibling
from shardtrain.errors import DataError

logger = logging.getLogger(__name__)

# fairseq reads text files in Python's universal-newlines mode: \r\n, \r and \n all end a line.
_NEWLINES = re.compile(r"\r\n|\r|\n")
_CHUNKS_PER_WORKER = 4  # several ranges per worker keep the progress bar moving
_PROGRESS_EVERY = 1 << 20  # bytes between progress-bar updates
_BATCH = 1024  # lines per write: numpy's per-call overhead dominates single short lines


@dataclasses.dataclass
class BinarizeStats:
    num_seq: int = 0
    num_tok: int = 0
    num_replaced: int = 0  # words not in the dictionary, stored as <unk>

    def merge(self, other: "BinarizeStats") -> None:
        self.num_seq += other.num_seq
        self.num_tok += other.num_tok
        self.num_replaced += other.num_replaced


def find_offsets(path: str, num_chunks: int) -> List[int]:
    """``num_chunks + 1`` byte offsets; each inner one is the start of a line."""
    size = os.path.getsize(path)
    offsets = [0] * num_chunks + [size]
    with open(path, "rb") as f:
        for i in range(1, num_chunks):
            f.seek(size // num_chunks * i)
            f.readline()  # skip to the start of the next line
            offsets[i] = f.tell()
    return offsets


def iter_lines(path: str, start: int = 0, end: Optional[int] = None,
               on_bytes: Optional[Callable[[int], None]] = None) -> Iterator[str]:
    """The lines (without line ends) of the byte range ``[start, end)`` of a UTF-8 file."""
    end = os.path.getsize(path) if end is None else end
    pos, unreported = start, 0
    with open(path, "rb") as f:
        f.seek(start)
        while pos < end:
            raw = f.readline()
            if not raw:
                break
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path} is not valid UTF-8 ({e.reason} at byte {pos + e.start}). Convert it, "
                                "e.g. `iconv -f latin1 -t utf-8 IN > OUT`, or remove the bad bytes.") from None
            lines = _NEWLINES.split(text)
            if lines[-1] == "":
                lines.pop()  # the text ended with a line end, not with an unterminated line
            yield from lines
            pos += len(raw)
            unreported += len(raw)
            if on_bytes is not None and (unreported >= _PROGRESS_EVERY or pos >= end):
                on_bytes(unreported)
                unreported = 0


def count_symbols(path: str, tokenize: Callable[[str], List[str]], workers: int = 1,
                  progress: bool = True, eos_word: str = "</s>") -> Counter:
    """How often each symbol occurs, plus one ``eos_word`` per line (fairseq's counting)."""
    tasks = [(path, start, end, tokenize, eos_word) for start, end in _ranges(path, workers)]
    total = Counter()
    for counts in _map_ranges(_count_range, tasks, workers, _progress_bar(path, "count", progress)):
        total.update(counts)
    return total


def _count_range(task, on_bytes=None) -> Counter:
    path, start, end, tokenize, eos_word = task
    counts = Counter()
    for line in iter_lines(path, start, end, on_bytes):
        counts.update(tokenize(line))
        counts[eos_word] += 1
    return counts


def binarize_file(path: str, out_prefix: str, dictionary: Dictionary, tokenize: Callable[[str], List[str]],
                  workers: int = 1, progress: bool = True) -> BinarizeStats:
    """Write ``out_prefix.bin/.idx`` (atomically) from the text file ``path``."""
    dtype = best_fitting_int_dtype(len(dictionary))
    parts_prefix = temp_sibling(out_prefix)
    tasks = [(path, start, end, dictionary, tokenize, dtype, f"{parts_prefix}{i}")
             for i, (start, end) in enumerate(_ranges(path, workers))]
    stats = BinarizeStats()
    try:
        bar = _progress_bar(path, "binarize", progress)
        for part_stats in _map_ranges(_binarize_range, tasks, workers, bar):
            stats.merge(part_stats)
        with MMapIndexedDatasetBuilder(data_file_path(out_prefix), dtype) as builder:
            for task in tasks:
                builder.merge_file_(task[-1])
            builder.finalize(index_file_path(out_prefix))
    finally:
        for task in tasks:
            for part in (data_file_path(task[-1]), index_file_path(task[-1])):
                if os.path.exists(part):
                    os.remove(part)
    logger.info("%s: %d sents, %d tokens, %.3g%% replaced by %s", path, stats.num_seq, stats.num_tok,
                100 * stats.num_replaced / max(stats.num_tok, 1), dictionary.unk_word)
    return stats


def _binarize_range(task, on_bytes=None) -> BinarizeStats:
    path, start, end, dictionary, tokenize, dtype, part_prefix = task
    stats = BinarizeStats()
    unk, unk_word = dictionary.unk(), dictionary.unk_word
    with MMapIndexedDatasetBuilder(data_file_path(part_prefix), dtype) as builder:
        batch = []
        for line in iter_lines(path, start, end, on_bytes):
            words = tokenize(line)
            ids = dictionary.encode_symbols(words)
            if unk in ids:
                stats.num_replaced += sum(1 for w, i in zip(words, ids) if i == unk and w != unk_word)
            stats.num_seq += 1
            stats.num_tok += len(ids)
            batch.append(ids)
            if len(batch) == _BATCH:
                builder.add_items(batch)
                batch = []
        builder.add_items(batch)
        builder.finalize(index_file_path(part_prefix))
    return stats


def _ranges(path: str, workers: int):
    chunks = 1 if workers <= 1 else workers * _CHUNKS_PER_WORKER
    offsets = find_offsets(path, chunks)
    return list(zip(offsets[:-1], offsets[1:]))


def _map_ranges(fn, tasks, workers: int, bar):
    """``fn`` over the tasks, results in task order; in-process when ``workers`` is 1."""
    with bar:
        if workers <= 1:
            for task in tasks:
                yield fn(task, bar.update)
            return
        with multiprocessing.get_context().Pool(workers) as pool:
            for task, result in zip(tasks, pool.imap(fn, tasks)):
                bar.update(task[2] - task[1])
                yield result


def _progress_bar(path: str, what: str, enabled: bool) -> tqdm:
    return tqdm(total=os.path.getsize(path), unit="B", unit_scale=True, file=sys.stderr,
                desc=f"{what} {os.path.basename(path)}", disable=not (enabled and sys.stderr.isatty()))
