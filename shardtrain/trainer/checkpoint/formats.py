"""The checkpoint formats: one interface, two implementations, chosen once.

A single file (single_file.py: everything in one ``torch.save`` file, written by
rank 0) or a sharded directory (sharded.py: the model and optimizer in DCP
shards written by every rank, the rest in ``extra.pt``). Saving picks the
format from the backend (``sharded_checkpoints``), loading from the path (a
directory is sharded); no other module asks which format it has.
"""
import os
from typing import Callable, Dict, List, Optional

from shardtrain.trainer.checkpoint.integrity import check_checksums


class CheckpointFormat:
    """How a checkpoint's parts (see contents.py) are laid out on disk and read back.

    One instance reads one checkpoint: the first method given a name pins what the name refers to then
    (see ``pinned``), and every later read of that name, by any method, reads the pinned checkpoint."""

    saves_directories = False  # a checkpoint is a directory, not a file: messages name it as one

    def pinned(self, path: str) -> str:
        """Where to read ``path`` from: what it named the first time this reader asked. An alias such as
        ``checkpoint_last`` can be re-pointed (or a file replaced) by a run saving meanwhile; resolving it
        again for each file mixed two checkpoints (shard-consolidate read update N's training state and
        N+1's weights) and verified other bytes than it read."""
        pins = self.__dict__.setdefault("_pins", {})
        if path not in pins:
            pins[path] = Pin(path)
        return pins[path].where

    def save(self, options, names: List[str], header: Dict, parts: Dict, epoch: int, updates: int,
             is_master: bool, prepare: Callable[[], None]) -> List[str]:
        """Collective: write ``header`` and ``parts`` under ``names`` in ``options.save_dir`` (the
        checkpoint section), then prune; ``prepare`` runs on rank 0 before anything is written
        (it makes and locks the save dir)."""
        raise NotImplementedError

    def prune(self, options) -> None:
        """Rank 0: drop the checkpoints --keep-last-epochs / --keep-interval-updates /
        --keep-best-checkpoints no longer keep."""
        raise NotImplementedError

    def read_state(self, path: str, model_only: bool = False) -> Dict:
        """The checkpoint's state without the tensors kept apart (a single file keeps none apart);
        ``model_only``: for inference and fine-tuning, also a convertible fairseq file.

        Every load starts here (load_tensors and read_tensors take the state this returns), and this
        verifies every file's checksum before reading a byte: no loading path can skip it."""
        check_checksums(self, path)
        return self.read_verified_state(path, model_only)

    def verify(self, path: str):
        """-> verify.Verified (None: no such file, left to the reader to name); checksums.Damaged on a mismatch."""
        raise NotImplementedError

    def read_verified_state(self, path: str, model_only: bool) -> Dict:
        """read_state, once ``path`` is verified."""
        raise NotImplementedError

    def check_model(self, trainer, state: Dict, path: str, cfg) -> None:
        """Raise a CheckpointError that names the flags when the checkpoint does not fit the run's model."""
        raise NotImplementedError

    def load_tensors(self, path: str, state: Dict, model_part, optimizer_part=None) -> None:
        """Load the model (and optimizer) into this run's layout, whatever world size saved them."""
        raise NotImplementedError

    def read_tensors(self, path: str, state: Dict, names: List[str]) -> Dict:
        """The named tensor parts ("model", "optimizer") whole, in memory, with no model to load into."""
        raise NotImplementedError

    def check_complete(self, path: str) -> None:
        """Raise a CheckpointError when ``path`` is not a whole checkpoint."""

    def wait(self) -> None:
        """Block until a background save (--async-save) is on disk under its names."""

    def close(self) -> None:
        """End of the run: the last save lands and its buffers are freed."""


class Pin:
    """``path`` held open: ``where`` names the opened file or directory itself (Linux's /proc/self/fd/N
    follows the open descriptor, not the name), so it reads the same bytes however the name is re-pointed
    or replaced. Without /proc, the real path the name resolves to now (links resolved once)."""

    def __init__(self, path: str):
        self.fd: Optional[int] = None
        try:
            self.fd = os.open(path, os.O_RDONLY)
        except OSError:  # missing or unreadable: the reader that follows names the problem
            self.where = path
            return
        self.where = f"/proc/self/fd/{self.fd}" if os.path.isdir("/proc/self/fd") else os.path.realpath(path)

    def __del__(self):
        if self.fd is not None:
            os.close(self.fd)


def resolve_checkpoint_path(path: str) -> str:
    """``path`` itself, or the sharded directory of that name without ``.pt``."""
    if not os.path.lexists(path) and path.endswith(".pt") and (
            os.path.isdir(path[:-3]) or os.path.islink(path[:-3])):  # a link even when dangling
        return path[:-3]
    return path


def both_forms(path: str) -> List[str]:
    """``path`` and, for a name ending in ``.pt``, the sharded directory of that name without it (which
    may exist beside it; manager.restore_path decides between them)."""
    if path.endswith(".pt") and (os.path.isdir(path[:-3]) or os.path.islink(path[:-3])):
        return [path, path[:-3]]
    return [path]


def matching(save_dir: str, pattern) -> List[str]:
    """Paths in ``save_dir`` whose names match ``pattern``, newest (largest number) first."""
    found = []
    for name in os.listdir(save_dir):
        m = pattern.fullmatch(name)
        if m:
            found.append((int(m.group(1)), os.path.join(save_dir, name)))
    return [p for _, p in sorted(found, reverse=True)]

