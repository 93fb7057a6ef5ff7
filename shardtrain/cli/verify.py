"""``shard-verify PATH``: check a checkpoint, every checkpoint in a save dir, or a data-bin, against the
checksums written with it.

Prints one line per checkpoint (or data-bin): intact, damaged (with what is
damaged and what to do), or not verifiable (written before shardtrain recorded
checksums); for a checkpoint trained with a plugin, the folder and module that
loading it needs with --user-dir. A file of another format (a Hugging Face
model.safetensors) is named for what it is, not called damaged. Exit status 0 when
nothing is damaged, 1 when something is, 2 for a PATH that is none of these (or
holds a file of another format and nothing damaged).
"""
import dataclasses
import os
import re
import sys
from typing import Callable, List, Tuple

from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.core.errors import ConfigError, ShardtrainError
from shardtrain.core.fields import field
from shardtrain.core.user_dir import describe as describe_plugin
from shardtrain.data.manifest import verify_data_bin
from shardtrain.trainer.checkpoint.choose import format_of, verify_checkpoint
from shardtrain.trainer.checkpoint.foreign import ForeignFileError
from shardtrain.trainer.checkpoint.formats import resolve_checkpoint_path
from shardtrain.trainer.checkpoint.integrity import check_checksums

EXIT_DAMAGED = 1
EXIT_NOT_A_CHECKPOINT = 2  # as a PATH that is none of the things shard-verify checks
# What a save dir holds under checkpoint names: files (single-file format) and directories or links to them (sharded)
CHECKPOINT_NAME = re.compile(r"checkpoint(\d+|_\d+_\d+|_best|_last)(\.pt)?")
CHECKPOINT_DIR_FILES = ("COMPLETE", "extra.pt", ".metadata")


@dataclasses.dataclass
class VerifyConfig:
    path: str = field(help="a checkpoint (file or sharded directory), a --save-dir, or a data-bin", positional=True)


@cli_entry("shard-verify")
def main(argv):
    args = flags.parse_dataclass(VerifyConfig, argv, "shard-verify", __doc__)
    damaged = foreign = 0
    for name, check in _targets(args.path):
        try:
            print(f"{name}: {check()}")
        except ForeignFileError as e:
            foreign += 1
            print(f"{name}: NOT A CHECKPOINT: {e}")
        except ShardtrainError as e:
            damaged += 1
            print(f"{name}: DAMAGED: {e}")
    if damaged:
        print(f"{damaged} damaged", file=sys.stderr)
        sys.exit(EXIT_DAMAGED)
    if foreign:
        sys.exit(EXIT_NOT_A_CHECKPOINT)


def _targets(path: str) -> List[Tuple[str, Callable[[], str]]]:
    """(what to print, the check) for each thing ``path`` holds."""
    if not os.path.lexists(path):
        raise ConfigError(f"{path} does not exist. Pass a checkpoint file or directory, a --save-dir, or a "
                          "data-bin made by shard-preprocess.")
    if _is_dangling(path):  # checkpoint_last named itself: damaged as it is inside a save dir, not a crash
        return [(path, _dangling(path))]
    if os.path.isfile(path) or _is_checkpoint_dir(path):
        return [(path, lambda: _check_checkpoint(path))]
    if os.path.isfile(os.path.join(path, "dict.txt")):
        return [(path, lambda: verify_data_bin(path))]
    return _save_dir_targets(path)


def _save_dir_targets(save_dir: str) -> List[Tuple[str, Callable[[], str]]]:
    """Every checkpoint in ``save_dir`` once; names that are links to another (sharded aliases)
    or hard links of it (single-file aliases) say which one they are."""
    targets, seen = [], {}
    names = [e for e in os.listdir(save_dir) if CHECKPOINT_NAME.fullmatch(e)]
    for entry in sorted(names, key=lambda e: _aliases_last(save_dir, e)):
        full = os.path.join(save_dir, entry)
        if _is_dangling(full):
            targets.append((full, _dangling(full)))
            continue
        key = os.stat(full).st_ino, os.stat(full).st_dev
        if key in seen:
            targets.append((full, lambda same=seen[key]: f"the same checkpoint as {same}"))
            continue
        seen[key] = entry
        targets.append((full, lambda p=full: _check_checkpoint(p)))
    if not targets:
        raise ConfigError(f"{save_dir} holds no checkpoints (checkpoint*.pt files or sharded checkpoint "
                          "directories) and is not a data-bin (no dict.txt). Pass a checkpoint, a --save-dir or a "
                          "data-bin.")
    return targets


def _check_checkpoint(path: str) -> str:
    """verify_checkpoint's line, and the plugin the checkpoint needs (loading never imports it unasked)."""
    where = resolve_checkpoint_path(path)
    if not os.path.exists(where):  # verify_checkpoint's paragraph names it
        return verify_checkpoint(path)
    fmt = format_of(where)  # one reader: it pins what an alias names, so the header read is the one verified
    found = check_checksums(fmt, where, notice=False)
    if found is None:  # gone meanwhile
        return verify_checkpoint(path)
    plugin = describe_plugin(fmt.read_verified_state(where, model_only=True))
    return f"{found.describe()}; {plugin}" if plugin else found.describe()


def _is_dangling(path: str) -> bool:
    """A link whose target is gone (or a loop of links): stat() of it fails, so it is reported, not checked."""
    return os.path.islink(path) and not os.path.exists(path)


def _dangling(link: str) -> Callable[[], str]:
    def check() -> str:
        raise ConfigError(f"dangling link to {os.readlink(link)!r}, which does not exist (moved or deleted); point "
                          "it at an intact checkpoint or remove it.")
    return check


def _is_checkpoint_dir(path: str) -> bool:
    return os.path.isdir(path) and any(os.path.exists(os.path.join(path, n)) for n in CHECKPOINT_DIR_FILES)


def _aliases_last(save_dir: str, name: str):
    """Real checkpoints before the names that alias them (links, then checkpoint_best/_last)."""
    return os.path.islink(os.path.join(save_dir, name)), name.startswith(("checkpoint_best", "checkpoint_last")), name


if __name__ == "__main__":
    main()
