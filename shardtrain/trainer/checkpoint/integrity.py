"""Is a checkpoint intact? Every load asks first (CheckpointFormat.read_state); ``shard-verify`` asks here.

A checkpoint written before shardtrain recorded checksums (a sharded directory without ``CHECKSUMS``, or a
pre-zip torch file) still loads, after a one-line notice. A damaged one is refused before any of its values
is read, with one paragraph naming the checkpoint, the file and the earlier checkpoints beside it.

Why refuse rather than fall back, for --restore-file checkpoint_last too: a damaged file means the storage
or a copy went wrong, which a person should know before more hours are written to the same place; quietly
resuming from an older checkpoint would also repeat the updates since then. The paragraph lists the
checkpoints to pass to --restore-file instead.
"""
import dataclasses
import logging
import os
import re
from typing import List, Optional

from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.checkpoint.checksums import Damaged, Outside

logger = logging.getLogger(__name__)
NO_CHECKSUMS = ("no checksums (written before shardtrain recorded them): NOTHING WAS VERIFIED; it only reads as a "
                "whole checkpoint, and a changed value inside it would go unnoticed")
_CHECKPOINT_NAME = re.compile(r"checkpoint\w*(\.pt)?")
# what each file of a checkpoint is, for the paragraph (a single file is "the checkpoint file")
KINDS = ((".distcp", "a shard file"), (".metadata", "the shard index .metadata"), ("extra.pt", "its training state"),
         ("CHECKSUMS", "its checksum manifest"), ("COMPLETE", "its COMPLETE marker"))


@dataclasses.dataclass(frozen=True)
class Verified:
    """What verification found: ``files`` checked, their ``nbytes``; ``checksums`` False for an old checkpoint."""
    checksums: bool
    files: int = 0
    nbytes: int = 0

    def describe(self) -> str:
        return f"intact ({self.files} files, {_size(self.nbytes)})" if self.checksums else NO_CHECKSUMS


def check_checksums(fmt, path: str, notice: bool = True) -> Optional[Verified]:
    """``fmt.verify(path)`` with its findings turned into a notice (for a load) or the paragraph; None:
    nothing to verify (a missing file, which the reader that follows names)."""
    try:
        found = fmt.verify(path)
    except Damaged as e:
        raise damaged_error(path, e) from None
    if notice and found is not None and not found.checksums:
        logger.warning(f"notice: {path} carries no checksums (written before shardtrain recorded them), so it "
                       "is loaded unverified")
    return found


def damaged_error(path: str, damage: Damaged) -> CheckpointError:
    others = earlier_checkpoints(path)
    where = os.path.dirname(os.path.abspath(path))
    listed = (f"the other checkpoints in {where}, newest first, are: {', '.join(others)}"
              if others else f"there is no other checkpoint in {where}")
    resume = f"--restore-file {others[0]}" if others else "--restore-file NAME"
    if isinstance(damage, Outside):  # not a fault of the storage: someone made or altered it
        return CheckpointError(
            f"Checkpoint {path} is refused: {damage.file} {damage.detail}. Every file a checkpoint refers to lies "
            "inside its directory and is checksummed; shardtrain never writes anything else, so this one was made "
            f"by another program or altered. Nothing was read from it and nothing was written; {listed}. Use a "
            f"checkpoint from a source you trust (to resume: {resume}).")
    return CheckpointError(
        f"Checkpoint {path} is damaged ({_kind(damage.file)} is missing or damaged): {damage.file} {damage.detail}. "
        f"Nothing was loaded from it and nothing was written. "
        f"Its bytes changed after it was saved (a disk, copy or transfer fault), so it cannot be trusted; "
        f"{listed}. Use an earlier one (to resume from the newest: {resume}), or copy an intact version back.")


def _kind(file: str) -> str:
    for ending, kind in KINDS:
        if file.endswith(ending):
            return kind
    return "the checkpoint file"


def earlier_checkpoints(path: str, limit: int = 5) -> List[str]:
    """The other checkpoints beside ``path``, newest first, one name each: never ``path`` itself under another
    name. A name is the same checkpoint when it is the same file: (st_dev, st_ino), as shard-verify compares,
    since checkpoint_last.pt is a hard link of its checkpoint (realpath sees symbolic links only)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        names = sorted(n for n in os.listdir(directory) if _CHECKPOINT_NAME.fullmatch(n))
    except OSError:
        return []
    try:
        damaged = _identity(path)
    except OSError:  # gone meanwhile: every name is another checkpoint
        damaged = None
    found = {}  # identity -> (time written, name); sorted, a numbered name comes before its aliases _best, _last
    for name in names:
        full = os.path.join(directory, name)
        try:
            identity, written = _identity(full), os.path.getmtime(full)
        except OSError:  # a dangling link, or gone meanwhile: no way out
            continue
        if identity != damaged and identity not in found:
            found[identity] = (written, name)
    return [name for _, name in sorted(found.values(), key=lambda t: (-t[0], t[1]))][:limit]


def _identity(path: str):
    """The file (or directory) ``path`` names, links followed."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"
