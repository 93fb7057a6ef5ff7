"""Which checkpoint format reads a path and which one a run writes: above the formats (formats.py holds their
base class and the path helpers, sharded.py and single_file.py the two implementations), so that no module of
the room imports one that imports it back."""
import os

from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.checkpoint.formats import CheckpointFormat, resolve_checkpoint_path
from shardtrain.trainer.checkpoint.integrity import check_checksums
from shardtrain.trainer.checkpoint.sharded import ShardedDirectory
from shardtrain.trainer.checkpoint.single_file import SingleFile


def format_of(path: str) -> CheckpointFormat:
    """The format of the checkpoint at ``path`` (after resolve_checkpoint_path)."""
    return ShardedDirectory() if os.path.isdir(path) else SingleFile()


def format_for_saving(sharded: bool, async_save: bool) -> CheckpointFormat:
    """The format a run writes: ``sharded`` is its backend's ``sharded_checkpoints``."""
    return ShardedDirectory(async_save) if sharded else SingleFile()


def verify_checkpoint(path: str) -> str:
    """``path``'s state in one line ("intact (5 files, 1.2 GB)" or integrity.NO_CHECKSUMS); a CheckpointError
    that says what to do when it is damaged, incomplete or missing."""
    path = resolve_checkpoint_path(path)
    if not os.path.exists(path):
        raise CheckpointError(f"Checkpoint {path!r} does not exist. Check the path.")
    return check_checksums(format_of(path), path, notice=False).describe()  # the line says it
