"""``shard-preprocess --trainpref FILE --validpref FILE --destdir DIR``: text to a data-bin."""
import contextlib
import signal
import sys
import threading

from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.data.preprocess import PreprocessConfig, preprocess
from shardtrain.trainer.metrics.logging_setup import setup_logging

PROG = "shard-preprocess"
EXIT_TERMINATED = 128 + signal.SIGTERM  # what a shell reports for a process killed by SIGTERM


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that clean-up runs as for Ctrl-C.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` swallows it."""


def parse_args(argv) -> PreprocessConfig:
    return flags.parse_dataclass(PreprocessConfig, argv, PROG, __doc__, title="preprocessing")


@cli_entry(PROG)
def main(argv):
    cfg = parse_args(argv)
    setup_logging()
    try:
        with _sigterm_raises():
            preprocess(cfg)
    except Terminated:
        print(f"{PROG}: terminated by SIGTERM; no half-written files were left in --destdir {cfg.destdir}.",
              file=sys.stderr)
        sys.exit(EXIT_TERMINATED)


@contextlib.contextmanager
def _sigterm_raises():
    # Python's default for SIGTERM is to die at once, leaving the staging directory (and a new,
    # empty --destdir) behind; a scheduler's SIGTERM should clean up like Ctrl-C does.
    def on_sigterm(signum, frame):
        raise Terminated()

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (main() called from a thread, e.g. in tests)
        return
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


if __name__ == "__main__":
    main()
