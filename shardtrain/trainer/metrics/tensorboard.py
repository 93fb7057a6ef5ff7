"""Tensorboard event files for a run: one ``SummaryWriter`` per record tag, on rank 0.

Its own file because it is an output of its own beside the log lines: it owns writers that outlive every
progress bar (the trainer makes one for the run, hands it to each bar and closes it at the end), checks
``--tensorboard-logdir`` before training starts, imports tensorboard only when asked for, and hides what an
earlier run wrote past the update a resumed run restarts from. ``progress.py``'s bars only call
:meth:`TensorboardWriter.add_scalars`.
"""
import os
from numbers import Number
from typing import Any, Dict, Mapping, Optional

import torch

from shardtrain.core.errors import ConfigError
from shardtrain.core.fileio import probe_writable_dir


class TensorboardWriter:
    """One ``SummaryWriter`` per tag under ``<logdir>/<tag>/``, made on first use.

    Owned by the trainer so writers outlive a single epoch's bar; call
    :meth:`close` (or use it as a context manager) when training ends.
    """

    def __init__(self, logdir: str):
        self.logdir = logdir
        self._summary_writer_cls = self.check_logdir(logdir)
        self._writers: Dict[str, Any] = {}
        self._purge_step: Optional[int] = None

    def resume_after(self, step: int) -> None:
        """A run resumed from a checkpoint of update ``step``: what an earlier run wrote after it (it went on
        past its last save, or another checkpoint was restored) is hidden from readers, so no step has two values."""
        self._purge_step = step + 1

    @staticmethod
    def check_logdir(logdir: str):
        """-> tensorboard's SummaryWriter class, once ``logdir`` is known to be writable."""
        try:
            # Imported here: tensorboard is slow to import and only needed when asked for.
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ConfigError(
                f"--tensorboard-logdir {logdir!r} needs the tensorboard package, which "
                f"could not be imported ({e}). Install it with `pip install tensorboard`, "
                f"or drop --tensorboard-logdir."
            ) from None
        try:  # now, not at the first record after an hour of training
            probe_writable_dir(logdir)
        except OSError as e:
            raise ConfigError(f"Cannot write to --tensorboard-logdir {logdir!r}: {e.strerror or e}. Choose a "
                              "writable directory, or drop --tensorboard-logdir.") from None
        return SummaryWriter

    def add_scalars(self, stats: Mapping[str, Any], tag: str, step: int) -> None:
        """Write every numeric stat (not ``num_updates``, which is the step)."""
        writer = self._writer(tag)
        for key, value in stats.items():
            if key == "num_updates":
                continue
            scalar = _scalar(value)
            if scalar is not None:
                writer.add_scalar(key, scalar, step)
        # Flushed each time so a crashed run still shows its curves.
        writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def __enter__(self) -> "TensorboardWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _writer(self, tag: str):
        if tag not in self._writers:
            self._writers[tag] = self._summary_writer_cls(os.path.join(self.logdir, tag), purge_step=self._purge_step)
        return self._writers[tag]


def _scalar(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return None
    if isinstance(value, Number):
        return float(value)
    if torch.is_tensor(value) and value.numel() == 1:
        return value.item()
    return None
