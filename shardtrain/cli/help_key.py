"""The help cache's key: every input a command's ``--help`` text depends on, and nothing slow.

The text depends on the command and its arguments, Python's and torch's versions, the terminal's width,
and the code that declares the flags: shardtrain's own ``.py`` files and built-in recipes (their names are
in shard-hydra-train's help), the installed plugins' packages and every ``--user-dir`` folder. Files are
keyed by their content, not their size and modification time: an edit that keeps the size within the
clock's resolution, or a copy that keeps the time (``cp -p``, ``rsync -t``, ``git checkout``), left the
old help in place. Hashing shardtrain's ~180 files (1 MB) takes about 8 ms of a loaded machine, so only
files over :data:`HASHED_UP_TO` (a plugin's compiled extension, data) fall back to size and time.
"""
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
from typing import Iterator, List, Optional, Sequence

import shardtrain
from shardtrain.core.fileio import open_regular

PACKAGE_DIR = os.path.dirname(os.path.abspath(shardtrain.__file__))
PLUGIN_GROUP = "shardtrain.plugins"  # core.plugins.GROUP, not imported: that module is the slow path's
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".so", ".pyd")  # code, recipes, compiled extensions
HASHED_UP_TO = 1 << 20  # bytes


def key(prog: str, argv: Sequence[str]) -> str:
    parts = [prog, str(len(argv)), *argv, sys.version, _version("torch"),
             str(shutil.get_terminal_size().columns), os.environ.get("COLUMNS", "")]
    parts += _tree(PACKAGE_DIR)
    for ep in sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda ep: (ep.name, ep.value)):
        parts += [ep.name, ep.value]
        for root in _plugin_roots(ep.value.split(":")[0]):
            parts += _tree(root)
    for user_dir in user_dirs(argv):  # all of them: argparse keeps the last, a superset is never stale
        parts += [user_dir, *_tree(user_dir)]
    digest = hashlib.sha256()
    for part in parts:  # length-prefixed, so no two lists of parts hash alike; surrogatepass: any str encodes
        data = part.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:32]


def user_dirs(argv: Sequence[str]) -> List[str]:
    """Every ``--user-dir PATH`` and ``--user-dir=PATH``, as core.user_dir imports it (``~`` expanded:
    no shell expands it after ``=``)."""
    found = []
    for i, arg in enumerate(argv):
        if arg == "--user-dir" and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif arg.startswith("--user-dir="):
            found.append(arg.split("=", 1)[1])
    return [os.path.abspath(os.path.expanduser(path)) for path in found if path]


def _tree(root: str) -> List[str]:
    """Every source file under ``root`` (or ``root`` itself, a file) as its path and content digest."""
    if os.path.isfile(root):
        return [root, _describe(root)]
    out = []
    for path in _walk(root):
        out += [path, _describe(path)]
    return out


def _walk(root: str) -> Iterator[str]:
    seen = set()  # symlinked folders are followed (a plugin may link a subpackage in), loops are not
    for folder, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs[:] = []
            continue
        seen.add(real)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        yield from (os.path.join(folder, f) for f in sorted(files) if f.endswith(SOURCE_SUFFIXES))


def _describe(path: str) -> str:
    """The file's content digest; size and time for a large file; a marker for one that cannot be read (a
    dangling symlink: it may be fixed later, and its target's content then makes a new key)."""
    try:
        with open_regular(path) as f:
            if f is None:  # a FIFO or a device: a read would hang or never end (the import refuses it)
                return "not a regular file"
            stat = os.fstat(f.fileno())
            if stat.st_size > HASHED_UP_TO:
                return f"size {stat.st_size} mtime {stat.st_mtime_ns}"
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        return f"unreadable {e.errno}"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _plugin_roots(module: str) -> List[str]:
    """The folders of a plugin's top-level package, or its one file (found, not imported): never the folder
    that holds a single-file module, which is site-packages itself."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations is not None:  # a package (a namespace package has several folders)
        return sorted(spec.submodule_search_locations)
    return [spec.origin] if spec.origin and os.path.isfile(spec.origin) else []
