"""Text file -> ``<prefix>.bin/.idx``, and symbol counting for the dictionary.

Both split the file into byte ranges on line boundaries (fairseq's
``find_offsets``), process the ranges in worker processes, and combine the
results in file order, so the output is identical for any number of workers.
Each input line becomes one item: its symbols' ids followed by ``</s>`` (an
empty line gives an item holding just ``</s>``), as fairseq-preprocess does.

There are never more workers than two per usable CPU or than non-empty ranges
(fairseq starts as many as asked, and 500 idle forks cost more than the work).
Workers ignore Ctrl-C: it reaches the whole process group, and only the parent
acts on it, by killing the workers.
"""
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import re
import signal
import sys
import threading
from collections import Counter
from typing import Callable, Iterator, List, Optional

from tqdm import tqdm

from shardtrain.data.dictionary import Dictionary
from shardtrain.data.indexed_dataset import (MMapIndexedDatasetBuilder, best_fitting_int_dtype, data_file_path,
                                             index_file_path)
from shardtrain.core.fileio import temp_sibling
from shardtrain.core.errors import DataError

logger = logging.getLogger(__name__)

# fairseq reads text files in Python's universal-newlines mode: \r\n, \r and \n all end a line.
_NEWLINES = re.compile(r"\r\n|\r|\n")
_CHUNKS_PER_WORKER = 4  # several ranges per worker keep the progress bar moving
_PROGRESS_EVERY = 1 << 20  # bytes between progress-bar updates
_BATCH = 1024  # lines per write: numpy's per-call overhead dominates single short lines
_PROCESSES_PER_CPU = 2  # a little oversubscription hides file reads; more only adds start-up cost
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


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
    ranges, workers = _plan(path, workers)
    tasks = [(path, start, end, tokenize, eos_word) for start, end in ranges]
    total = Counter()
    with _mapped(_count_range, tasks, workers, _progress_bar(path, "count", progress)) as results:
        for counts in results:
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
                  workers: int = 1, progress: bool = True,
                  to_ids: Optional[Callable[[str], List[int]]] = None) -> BinarizeStats:
    """Write ``out_prefix.bin/.idx`` (atomically) from the text file ``path``. ``to_ids``: a line's ids, eos
    included, straight from a tokenizer that owns the ids (--hf-tokenizer), instead of ``tokenize`` and the
    dictionary."""
    dtype = best_fitting_int_dtype(len(dictionary))
    parts_prefix = temp_sibling(out_prefix)
    ranges, workers = _plan(path, workers)
    tasks = [(path, start, end, dictionary, tokenize, to_ids, dtype, f"{parts_prefix}{i}")
             for i, (start, end) in enumerate(ranges)]
    stats = BinarizeStats()
    try:
        bar = _progress_bar(path, "binarize", progress)
        with _mapped(_binarize_range, tasks, workers, bar) as results:
            for part_stats in results:
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
    path, start, end, dictionary, tokenize, to_ids, dtype, part_prefix = task
    stats = BinarizeStats()
    unk, unk_word = dictionary.unk(), dictionary.unk_word
    with MMapIndexedDatasetBuilder(data_file_path(part_prefix), dtype) as builder:
        batch = []
        for line in iter_lines(path, start, end, on_bytes):
            if to_ids is not None:
                ids = to_ids(line)
            else:
                words = tokenize(line)
                ids = dictionary.encode_symbols(words)
            if unk in ids and to_ids is None:
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


def usable_workers(requested: int) -> int:
    """``requested`` capped at two processes per CPU this process may run on."""
    try:
        cpus = len(os.sched_getaffinity(0))  # honours taskset/cgroup cpusets, unlike os.cpu_count()
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(requested, _PROCESSES_PER_CPU * cpus))


def _plan(path: str, workers: int):
    """The non-empty byte ranges to process and how many processes to use for them."""
    wanted = usable_workers(workers)
    ranges = _ranges(path, wanted)
    if len(ranges) < wanted:
        logger.debug("%s: only %d ranges of work, so %d workers instead of %d", path, len(ranges),
                     max(len(ranges), 1), wanted)
    return ranges, max(1, min(wanted, len(ranges)))


def _ranges(path: str, workers: int):
    chunks = 1 if workers <= 1 else workers * _CHUNKS_PER_WORKER
    offsets = find_offsets(path, chunks)
    # A small file gives many equal offsets; an empty range is no work, and a process for it only costs.
    return [(start, end) for start, end in zip(offsets[:-1], offsets[1:]) if end > start]


@contextlib.contextmanager
def _mapped(fn, tasks, workers: int, bar):
    """``with _mapped(...) as results``: ``fn`` over the tasks, in task order; in-process when
    ``workers`` is 1. Leaving the block early (an error, Ctrl-C) kills the workers at once."""
    with bar:
        if workers <= 1:
            yield (fn(task, bar.update) for task in tasks)
            return
        procs, conns = [], []
        try:
            with stop_signals_deferred():  # a half-started worker set could not be stopped cleanly
                _start_workers(fn, tasks, workers, procs, conns)
            yield _in_order(procs, conns, tasks, bar)
        finally:
            with stop_signals_deferred():  # a second Ctrl-C must not leave workers running
                _stop_workers(procs)


def _start_workers(fn, tasks, workers: int, procs, conns) -> None:
    """Worker ``i`` runs tasks ``i, i + workers, ...`` and sends each result on its own pipe.

    Not multiprocessing.Pool: its workers share a queue lock, and a worker killed while holding it
    (a scheduler's SIGTERM reaches every process) hangs Pool.terminate() for good. Here a dead worker
    shows up as EOF on its pipe. The ranges are of equal size, so a fixed share balances well enough."""
    ctx = multiprocessing.get_context()
    # Workers inherit the mask: with the stop signals blocked, none reaches a worker before
    # _worker_main has set its handlers.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        for i in range(workers):
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker_main, args=(fn, tasks[i::workers], send, mask), daemon=True)
            proc.start()
            send.close()  # only the worker may hold the sending end, or its death would not show as EOF
            procs.append(proc)
            conns.append(receive)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _worker_main(fn, tasks, send, mask) -> None:
    # Ctrl-C reaches every process in the group; only the parent acts on it (by killing the workers), so
    # the workers print no KeyboardInterrupt tracebacks. SIGTERM kills at once, whatever the parent set.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        for task in tasks:
            send.send((True, fn(task)))
    except BrokenPipeError:
        pass  # the parent is gone (killed with SIGKILL): nobody to tell
    except Exception as e:  # e.g. DataError for invalid UTF-8: the parent raises it
        send.send((False, e))


def _in_order(procs, conns, tasks, bar):
    for i, task in enumerate(tasks):
        try:
            ok, result = conns[i % len(conns)].recv()
        except EOFError:
            proc = procs[i % len(procs)]
            proc.join()
            raise DataError(f"A worker process died (exit status {proc.exitcode}) while reading {task[0]}, "
                            "perhaps killed for using too much memory. Re-run with fewer --workers.") from None
        if not ok:
            raise result
        bar.update(task[2] - task[1])
        yield result


def _stop_workers(procs) -> None:
    for proc in procs:
        proc.kill()  # no-op for a worker that has finished; the parent removes any part files
    for proc in procs:
        proc.join()


@contextlib.contextmanager
def stop_signals_deferred():
    """Hold SIGINT and SIGTERM until the block ends, then act on the first one as usual.

    For steps that must not be cut short (publishing files, cleaning up, starting or stopping the pool).
    Swaps the Python handlers rather than blocking the signals, since a blocked signal still reaches
    another thread (tqdm's monitor) and so the main thread's handler. Only the main thread may set
    handlers; elsewhere this does nothing."""
    signals = (signal.SIGINT, signal.SIGTERM)
    # getsignal() gives None for a handler set outside Python, which signal() could not restore.
    if threading.current_thread() is not threading.main_thread() or None in map(signal.getsignal, signals):
        yield
        return
    caught = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            signal.raise_signal(caught[0])  # with the handler restored: raise, die or be ignored, as before


def _progress_bar(path: str, what: str, enabled: bool) -> tqdm:
    return tqdm(total=os.path.getsize(path), unit="B", unit_scale=True, file=sys.stderr,
                desc=f"{what} {os.path.basename(path)}", disable=not (enabled and sys.stderr.isatty()))
