"""Process-wide logging set-up for the command-line entry points.

fairseq's format, INFO on stdout for rank 0 and WARNING for the other ranks
(so N ranks do not print N copies), and an optional ``--log-file`` that gets
the same records. The handlers are marked as ours, so calling
:func:`setup_logging` again replaces them and :func:`teardown_logging` removes
them (tests call it; so may a long-lived process between runs).
"""
import logging
import os
import sys
from typing import Optional

from tqdm import tqdm

from shardtrain.core.errors import ConfigError

FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"
# A record's attribute ONLY, when set, names the one destination that shows it (progress.py: a tqdm
# console shows a bar, its --log-file the json records the bar stands for).
ONLY, FILE, CONSOLE = "shardtrain_only", "file", "console"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


class _StdoutHandler(logging.StreamHandler):
    """Ours; remembers the root level it replaced so teardown can restore it.

    Writes through ``tqdm.write``, which clears the live progress bars, writes the line and redraws them
    below it: a record never lands on a bar's line (tqdm's ``logging_redirect_tqdm`` does the same, but
    only while its context is open, and bars open and close at many places)."""

    def __init__(self, previous_root_level: int):
        super().__init__(sys.stdout)
        self.previous_root_level = previous_root_level

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, ONLY, CONSOLE) != CONSOLE:
            return
        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:  # noqa: BLE001 - logging's contract: a failing handler reports, never raises
            self.handleError(record)


class _FileHandler(logging.FileHandler):
    """Ours; appends, so a resumed run keeps the earlier lines.

    A write that fails (a full disk, a quota, a lost mount) is said once, on the console, and the file is then
    left alone while training goes on: logging's own answer is a traceback on stderr for every record, and
    stopping a run that can still save checkpoints (maybe elsewhere) for its log would lose more than the lines."""

    given_up = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.given_up and getattr(record, ONLY, FILE) == FILE:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            return super().handleError(record)
        self.given_up = True  # before the notice: it must not come back here
        logging.getLogger(__name__).warning(
            f"--log-file {self.baseFilename!r} cannot be written ({error.strerror or error}); training goes on "
            "and its log lines now go to the console only. Free space there (or pass another --log-file when "
            "you resume) to keep a log file; the lines from here on are not in it.", extra={ONLY: CONSOLE})


def setup_logging(log_file: Optional[str] = None, rank: int = 0) -> None:
    """Send log records to stdout (and ``log_file``), replacing any earlier set-up."""
    teardown_logging()
    root = logging.getLogger()
    formatter = logging.Formatter(FORMAT, datefmt=DATE_FORMAT)
    handlers = [_open_log_file(log_file)] if log_file else []
    handlers.append(_StdoutHandler(previous_root_level=root.level))
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)


def _open_log_file(path: str) -> _FileHandler:
    if os.path.isdir(path):
        raise ConfigError(f"--log-file {path!r} is a directory; pass a file path such as "
                          f"{os.path.join(path, 'train.log')!r}.")
    try:
        return _FileHandler(path, mode="a", encoding="utf-8")
    except OSError as e:
        raise ConfigError(
            f"Cannot open --log-file {path!r} for appending: {e.strerror}. "
            f"Create its directory or pass a writable path."
        ) from None


def teardown_logging() -> None:
    """Remove and close the handlers :func:`setup_logging` added; restore the root level."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, (_StdoutHandler, _FileHandler)):
            root.removeHandler(handler)
            handler.close()
            if isinstance(handler, _StdoutHandler):
                root.setLevel(handler.previous_root_level)
