"""Which checkpoint a name means when a save dir holds it in both forms.

``checkpoint_last.pt`` (one file: pytorch_ddp, no_c10d, zero) and ``checkpoint_last`` (a sharded directory:
fully_sharded) can both be in one --save-dir: a run relaunched with another backend, or shard-consolidate
writing into the save dir. Taking the file whenever it existed resumed a newer sharded run from an old update,
redid the rest and overwrote the newer checkpoints, at every restart again. The rule: the one with more
recorded updates (the progress a user must never lose); at the same update, the form this run writes (both hold
the same progress; no conversion); when one's update count cannot be read, the one written last. Either way
the log says which was taken and why, and the other is left as it is. Only the default name is decided here: a
name passed explicitly (``--restore-file X.pt``, or a full path) loads as named (manager.restore_path).
"""
import logging
import os
import time
from typing import Optional, Tuple

from shardtrain.trainer.checkpoint.safe_loading import load_weights_only

logger = logging.getLogger(__name__)
Info = Tuple[Optional[int], float]  # (recorded updates or None, time written)


def recorded_updates(path: str) -> Optional[int]:
    """The update count ``path`` (a file, or a sharded directory's extra.pt) records; None when unreadable.
    The file's tensors stay in the file (memory-mapped): only the small pickle is read."""
    try:
        if os.path.isdir(path):
            state = load_weights_only(os.path.join(path, "extra.pt"), path)
        else:
            state = load_weights_only(path, path, mmap=True)
        return int(state["train_state"]["num_updates"])
    except Exception:  # noqa: BLE001 - any unreadable checkpoint: the time it was written decides
        return None


def written_at(path: str) -> float:
    """When ``path`` was written: a sharded directory's COMPLETE marker is its last file."""
    marker = os.path.join(path, "COMPLETE")
    return os.path.getmtime(marker if os.path.isfile(marker) else path)


def pick(file: Info, directory: Info, prefer_directory: bool) -> Tuple[bool, str]:
    """-> (the directory wins, why): the rule of this module's docstring, on (updates, time written)."""
    (f_updates, f_time), (d_updates, d_time) = file, directory
    if f_updates is not None and d_updates is not None:
        if f_updates != d_updates:
            return d_updates > f_updates, f"it records more updates ({max(f_updates, d_updates)} against " \
                                          f"{min(f_updates, d_updates)})"
        return prefer_directory, f"both record update {f_updates}, and this run's backend writes that form"
    return d_time > f_time, "the other's update count cannot be read, and this one was written last"


def newer(file: str, directory: str, prefer_directory: bool) -> str:
    """Of ``file`` (one-file form) and ``directory`` (sharded form) of one checkpoint name, the one to resume;
    logged with both and the reason."""
    infos = [(recorded_updates(p), written_at(p)) for p in (file, directory)]
    take_directory, why = pick(*infos, prefer_directory)
    chosen, other = (directory, file) if take_directory else (file, directory)
    described = "; ".join(f"{p} ({'?' if u is None else u} updates, written "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))})"
                          for p, (u, t) in zip((file, directory), infos))
    # the full path: a name other than the default is taken as named (manager.restore_path), so this never loops
    logger.warning(f"--save-dir holds this checkpoint in both forms: {described}. Resuming from {chosen}: {why}. "
                   f"{other} is left as it is (to resume from it instead: --restore-file {os.path.abspath(other)}).")
    return chosen
