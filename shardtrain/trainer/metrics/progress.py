"""Progress bars and log formats (``--log-format json|simple|tqdm|none``).

Output lines have fairseq's shapes, so existing log parsers keep working::

    simple  epoch 001:     10 / 100 loss=6.2, ppl=73.4, wps=1520
    json    {"epoch": 1, "update": 0.1, "loss": "6.2", "ppl": "73.4", ...}
    summary epoch 001 | loss 6.2 | ppl 73.4 | ...        (simple, tqdm)
            {"epoch": 1, "train_loss": "6.2", ...}       (json)

All text goes through the ``shardtrain.progress`` logger (so ``--log-file``,
set up by :func:`shardtrain.trainer.metrics.logging_setup.setup_logging`, copies it);
under ``tqdm`` and ``none`` the console shows a bar or nothing, and the log file gets
every record as a json line instead, so it always holds the training curve;
each record carries the tag ("train_inner", "valid", ...) as its name, which
is what fairseq shows in the name column.

Tensorboard: the trainer owns one :class:`~shardtrain.trainer.metrics.tensorboard.TensorboardWriter`
for the run (on rank 0 only), passes it to every bar, and closes it at the end.
"""
import json
import logging
import sys
from numbers import Number
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional

import torch

from shardtrain.core.errors import ConfigError
from shardtrain.trainer.metrics.logging_setup import CONSOLE, FILE, ONLY
from shardtrain.trainer.metrics.tensorboard import TensorboardWriter

LOG_FORMATS = ("json", "simple", "tqdm", "none")
# fairseq's bar shows every stat; three keep the tqdm line readable.
TQDM_POSTFIX_KEYS = ("loss", "lr", "wps")

logger = logging.getLogger("shardtrain.progress")


def build_progress_bar(
    iterator: Iterable,
    *,
    log_format: str,
    log_interval: int = 100,
    epoch: Optional[int] = None,
    prefix: Optional[str] = None,
    tensorboard: Optional[TensorboardWriter] = None,
    is_tty: Optional[bool] = None,
) -> "ProgressBar":
    """Wrap ``iterator`` in a bar of ``log_format``.

    ``tqdm`` falls back to ``simple`` when stderr is not a terminal (``is_tty``
    overrides the check). If ``iterator`` has an ``n`` attribute (batches already
    consumed, after a mid-epoch resume), positions count on from it.
    """
    if log_format not in _BARS:
        raise ConfigError(
            f"Unknown --log-format {log_format!r}. Choose one of: {', '.join(LOG_FORMATS)}."
        )
    if is_tty is None:
        is_tty = sys.stderr.isatty()
    if log_format == "tqdm" and not is_tty:
        log_format = "simple"
    return _BARS[log_format](iterator, epoch=epoch, prefix=prefix, log_interval=log_interval, tensorboard=tensorboard)


class ProgressBar:
    """Iterate it; ``log`` after every update, ``print`` a summary, then ``close``."""

    def __init__(self, iterable, *, epoch, prefix, log_interval, tensorboard):
        self.iterable = iterable
        self.epoch = epoch
        self.log_interval = log_interval
        self.tensorboard = tensorboard
        self.offset = getattr(iterable, "n", 0)
        self.i: Optional[int] = None  # position of the current item
        parts = [f"epoch {epoch:03d}"] if epoch is not None else []
        self.prefix = " | ".join(parts + ([prefix] if prefix else []))

    def __len__(self) -> int:
        return len(self.iterable)

    def __iter__(self) -> Iterator:
        for i, item in enumerate(self.iterable, start=self.offset):
            self.i = i
            yield item

    def due(self, step: int) -> bool:
        """Whether ``log`` at this update writes anything. The trainer checks it
        before computing (and resetting) the interval's stats."""
        return step > 0 and self.log_interval > 0 and step % self.log_interval == 0

    def log(self, stats: Mapping[str, Any], tag: str, step: int) -> None:
        """Intermediate stats; shown only every ``log_interval`` updates."""
        if self.due(step):
            if self.tensorboard is not None:
                self.tensorboard.add_scalars(stats, tag, step)
            self._log_line(stats, tag)

    def print(self, stats: Mapping[str, Any], tag: str, step: int) -> None:
        """End-of-epoch or validation summary; always shown."""
        if self.tensorboard is not None:
            self.tensorboard.add_scalars(stats, tag, step)
        self._print_line(stats, tag)

    def close(self) -> None:
        pass

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _log_line(self, stats, tag) -> None:
        pass

    def _print_line(self, stats, tag) -> None:
        pass

    def _position(self) -> str:
        size = _length(self.iterable)
        current = (self.i if self.i is not None else self.offset - 1) + 1
        return f"{current:5d} / {size if size is not None else '?'}"


class SimpleBar(ProgressBar):
    """One plain line per interval, for files and non-terminals."""

    def _log_line(self, stats, tag):
        commas = ", ".join(f"{k}={format_stat(v)}" for k, v in stats.items())
        _emit(tag, f"{self.prefix}:  {self._position()} {commas}")

    def _print_line(self, stats, tag):
        _emit(tag, _pipes(self.prefix, stats))


class JsonBar(ProgressBar):
    """One JSON object per line; summaries prefix keys with the tag."""

    def _log_line(self, stats, tag, only=None):
        head: Dict[str, Any] = {}
        if self.epoch is not None:
            head["epoch"] = self.epoch
            size = _length(self.iterable)
            if size and self.i is not None:
                head["update"] = round(self.epoch - 1 + (self.i + 1) / size, 3)
        _emit(tag, json.dumps({**head, **_formatted(stats)}), only)

    def _print_line(self, stats, tag, only=None):
        head = {"epoch": self.epoch} if self.epoch is not None else {}
        body = {f"{tag}_{k}": v for k, v in _formatted(stats).items()}
        _emit(tag, json.dumps({**head, **body}), only)


class NoneBar(ProgressBar):
    """``--log-format none``: no text on the console (tensorboard still written); the --log-file
    still gets every record, as json lines (what shard-plot reads)."""

    def _log_line(self, stats, tag):
        JsonBar._log_line(self, stats, tag, only=FILE)

    def _print_line(self, stats, tag):
        JsonBar._print_line(self, stats, tag, only=FILE)


class TqdmBar(ProgressBar):
    """A terminal progress bar; loss, lr and wps go in its postfix."""

    def __init__(self, iterable, **kwargs):
        super().__init__(iterable, **kwargs)
        from tqdm import tqdm  # imported only when a terminal bar is wanted

        self.tqdm = tqdm(
            iterable,
            self.prefix,
            initial=self.offset,
            leave=False,
            # Ranks that log only warnings (all but rank 0) show no bar.
            disable=logger.getEffectiveLevel() > logging.INFO,
        )

    def __iter__(self) -> Iterator:
        for i, item in enumerate(self.tqdm, start=self.offset):
            self.i = i
            yield item

    def log(self, stats, tag, step):
        postfix = {k: format_stat(stats[k]) for k in TQDM_POSTFIX_KEYS if k in stats}
        self.tqdm.set_postfix(postfix, refresh=False)
        super().log(stats, tag, step)  # tensorboard and the --log-file at the interval; the bar shows the rest

    def _log_line(self, stats, tag):
        # The bar's postfix is gone once it moves on: the --log-file keeps the record, as a json line.
        JsonBar._log_line(self, stats, tag, only=FILE)

    def _print_line(self, stats, tag):
        _emit(tag, _pipes(self.prefix, stats), only=CONSOLE)
        JsonBar._print_line(self, stats, tag, only=FILE)  # the file's records all have one shape

    def close(self):
        self.tqdm.close()


_BARS = {"json": JsonBar, "simple": SimpleBar, "tqdm": TqdmBar, "none": NoneBar}


def format_stat(value: Any) -> Any:
    """fairseq's formatting: numbers as ``{:g}`` strings, tensors as lists."""
    if isinstance(value, Number):
        return f"{value:g}"
    if torch.is_tensor(value):
        return value.tolist()
    return value


def _formatted(stats: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: format_stat(v) for k, v in stats.items()}


def _pipes(prefix: str, stats: Mapping[str, Any]) -> str:
    fields = [f"{k} {format_stat(v)}" for k, v in stats.items()]
    return " | ".join(([prefix] if prefix else []) + fields)


def _emit(tag: str, message: str, only: Optional[str] = None) -> None:
    """Log ``message`` through the progress logger under the name ``tag``; ``only``: FILE or CONSOLE
    (logging_setup's handlers skip a record marked for the other), None for both.

    fairseq renamed its shared logger around each call; building the record
    with the tag as its name gives the same output without mutating a logger.
    """
    if logger.isEnabledFor(logging.INFO):
        extra = {ONLY: only} if only else None
        record = logger.makeRecord(tag or logger.name, logging.INFO, __file__, 0, message, None, None, extra=extra)
        logger.handle(record)


def _length(iterable) -> Optional[int]:
    try:
        return len(iterable)
    except TypeError:
        return None
