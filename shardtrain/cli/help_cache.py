"""``--help`` answered from a cache, without importing torch.

A command's help lists the flags of the components it would run, and their config classes sit next to
their code, which imports torch: building the help took 2.9 s of an idle machine (torch's import is
most of it). The text depends only on inputs help_key.py names (the command line, the terminal's width,
the content of shardtrain's code and recipes and of the plugins), so it is kept under a key made of all of
them, and a later ``--help`` with the same key prints it without importing anything heavy. The first
``--help`` after installing or editing still builds the text.

Only a help that succeeded (exit status 0, every line written) is kept. An entry is checked before it is
printed: its header names the format, its key and the sha256 of its text, and the text holds no control
character but newline and tab, so a damaged or planted file never reaches the terminal (escape sequences
included); it is deleted and the help built again.
"""
import contextlib
import hashlib
import io
import os
import re
import sys
from typing import Iterator, Optional, Sequence

from shardtrain.cli.help_key import key
from shardtrain.core.fileio import atomic_write_bytes

ENV_DIR = "SHARDTRAIN_CACHE_DIR"  # default: $XDG_CACHE_HOME/shardtrain, else ~/.cache/shardtrain
FORMAT = "shardtrain-help-cache 2"  # an entry's first line: FORMAT KEY SHA256-OF-THE-TEXT
MAX_ENTRY_BYTES = 1 << 20  # shard-train's help is ~30 kB: anything far larger is not one
# C0 and C1 controls (ESC starts a terminal's escape sequences) and DEL but tab and newline, and the
# bidirectional overrides that make a terminal show text in another order than it reads.
NOT_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

__all__ = ["asks_help", "cache_dir", "key", "lookup", "recording"]


def asks_help(argv: Sequence[str]) -> bool:
    argv = list(argv)
    head = argv[:argv.index("--")] if "--" in argv else argv
    return "-h" in head or "--help" in head


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(ENV_DIR) or os.path.join(base, "shardtrain")


def entry_path(name: str) -> str:
    return os.path.join(cache_dir(), "help", name + ".txt")


def lookup(prog: str, argv: Sequence[str]) -> Optional[str]:
    """The cached help, checked; None (and a bad entry deleted) when there is none to trust."""
    try:
        name = key(prog, argv)
        with open(entry_path(name), "rb") as f:
            data = f.read(MAX_ENTRY_BYTES + 1)
    except (OSError, ValueError):  # no entry yet, an unreadable cache; ValueError: a key that cannot be made
        return None
    text = checked(data, name)
    if text is None:
        with contextlib.suppress(OSError):
            os.remove(entry_path(name))
    return text


def checked(data: bytes, name: str) -> Optional[str]:
    """The text of the entry ``data`` stored under ``name``, or None unless every check holds."""
    header, newline, body = data.partition(b"\n")
    if not newline or len(data) > MAX_ENTRY_BYTES:
        return None
    if header != f"{FORMAT} {name} {hashlib.sha256(body).hexdigest()}".encode():
        return None  # another format, another key's entry, or a text changed since it was written
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text and not NOT_TEXT.search(text) else None


@contextlib.contextmanager
def recording(prog: str, argv: Sequence[str]) -> Iterator[None]:
    """Run the command's own --help inside: what it prints goes to stdout and, when it exits 0 having
    written all of it, to the cache. An exception or another status stores nothing."""
    real = sys.stdout
    tee = _Tee(real)
    sys.stdout = tee
    try:
        yield
    except SystemExit as e:
        sys.stdout = real
        if e.code in (0, None) and not tee.failed:
            store(prog, argv, tee.copy.getvalue())
        raise
    finally:
        sys.stdout = real


def store(prog: str, argv: Sequence[str], text: str) -> None:
    if not text or NOT_TEXT.search(text):
        return  # a plugin's coloured help is printed, never replayed: the check on reading would refuse it
    try:
        body = text.encode("utf-8")
        name = key(prog, argv)
        os.makedirs(os.path.join(cache_dir(), "help"), exist_ok=True)
        header = f"{FORMAT} {name} {hashlib.sha256(body).hexdigest()}\n".encode()
        atomic_write_bytes(entry_path(name), header + body)
    except (OSError, ValueError):
        pass  # an unwritable cache (or text no file can hold) only means the next --help builds the text again


class _Tee(io.TextIOBase):
    """Writes to the real stdout, then keeps a copy; remembers a failed write, which argparse swallows
    (its print_help ignores OSError), so that a help cut short is never stored."""

    def __init__(self, real):
        self.real, self.copy, self.failed = real, io.StringIO(), False

    def write(self, text: str) -> int:
        try:
            self.real.write(text)
        except BaseException:
            self.failed = True
            raise
        return self.copy.write(text)

    def flush(self) -> None:
        try:
            self.real.flush()
        except BaseException:
            self.failed = True
            raise
