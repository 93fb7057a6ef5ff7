"""``--help`` answered from a cache, without importing torch.

A command's help lists the flags of the components it would run, and their config classes sit next to
their code, which imports torch: building the help took 2.9 s of an idle machine (torch's import is
most of it). The text depends only on the command line, the terminal's width, shardtrain's code and the
plugins (installed ones and ``--user-dir``), so it is kept under a key made of all of those, and a
later ``--help`` with the same key prints it without importing anything heavy. A change to any of them
(a file's size or modification time) makes a new key, so an edited config class is never described
from the cache. The first ``--help`` after installing or editing still builds the text.
"""
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import io
import os
import shutil
import sys
from typing import Iterator, List, Optional, Sequence

import shardtrain
from shardtrain.core.fileio import atomic_write_bytes

ENV_DIR = "SHARDTRAIN_CACHE_DIR"  # default: $XDG_CACHE_HOME/shardtrain, else ~/.cache/shardtrain
PLUGIN_GROUP = "shardtrain.plugins"  # core.plugins.GROUP, not imported: that module is the slow path's


def asks_help(argv: Sequence[str]) -> bool:
    argv = list(argv)
    head = argv[:argv.index("--")] if "--" in argv else argv
    return "-h" in head or "--help" in head


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(ENV_DIR) or os.path.join(base, "shardtrain")


def key(prog: str, argv: Sequence[str]) -> str:
    parts = [prog, *argv, sys.version, _version("torch"), str(shutil.get_terminal_size().columns),
             os.environ.get("COLUMNS", "")]
    parts += _tree(os.path.dirname(shardtrain.__file__))
    for ep in sorted(importlib.metadata.entry_points(group=PLUGIN_GROUP), key=lambda ep: (ep.name, ep.value)):
        parts += [ep.name, ep.value, *_tree(_package_dir(ep.value.split(":")[0]))]
    user_dir = _value_of(argv, "--user-dir")
    if user_dir:
        parts += [os.path.abspath(user_dir), *_tree(os.path.abspath(user_dir))]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def lookup(prog: str, argv: Sequence[str]) -> Optional[str]:
    try:
        with open(os.path.join(cache_dir(), "help", key(prog, argv) + ".txt"), encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


@contextlib.contextmanager
def recording(prog: str, argv: Sequence[str]) -> Iterator[None]:
    """Run the command's own --help inside: what it prints goes to stdout and, when it exits 0, the cache."""
    real, copy = sys.stdout, io.StringIO()
    sys.stdout = _Tee(real, copy)
    try:
        yield
    except SystemExit as e:
        sys.stdout = real
        if e.code in (0, None) and copy.getvalue():
            _store(key(prog, argv), copy.getvalue())
        raise
    finally:
        sys.stdout = real


def _store(name: str, text: str) -> None:
    try:
        os.makedirs(os.path.join(cache_dir(), "help"), exist_ok=True)
        atomic_write_bytes(os.path.join(cache_dir(), "help", name + ".txt"), text.encode("utf-8"))
    except OSError:
        pass  # an unwritable cache only means the next --help builds the text again


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _tree(root: Optional[str]) -> List[str]:
    """Every Python and YAML file (the built-in recipes) under ``root`` as path, size and modification time."""
    out = []
    for folder, dirs, files in os.walk(root or ""):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith((".py", ".yaml"))):
            stat = os.stat(os.path.join(folder, name))
            out.append(f"{os.path.join(folder, name)}:{stat.st_size}:{stat.st_mtime_ns}")
    return out


def _package_dir(module: str) -> Optional[str]:
    """The folder of a plugin's top-level package (found, not imported)."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return os.path.dirname(origin) if origin else None


def _value_of(argv: Sequence[str], flag: str) -> Optional[str]:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None
