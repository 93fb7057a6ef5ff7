"""Entry-point wrapper: user mistakes become one paragraph and a non-zero exit;
Ctrl-C and SIGTERM become one line and the exit status a shell reports for them."""
import contextlib
import functools
import signal
import sys
import threading
from typing import Callable, Optional

from shardtrain.core.errors import ShardtrainError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM
# Said after every interruption: each command writes through temporary names (removed on the way
# out, or by the next run if the process was killed outright) and renames only whole files.
_NOTHING_HALF_WRITTEN = "no half-written file was left in place of an output; run the same command again to redo it"


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that clean-up runs as for Ctrl-C.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` swallows it."""


def cli_entry(prog: str, rewrite: Optional[Callable[[str], str]] = None, interrupted: str = _NOTHING_HALF_WRITTEN):
    """Decorate a ``main(argv)``: a ShardtrainError prints ``PROG: error: ...``
    (no traceback) and exits 2; Ctrl-C and SIGTERM print one line and exit 130 / 143;
    anything else is a bug and keeps its traceback.

    Called with an explicit ``argv`` (from Python), the wrapper returns main's
    result; called as a console script (``argv=None``) it returns None, since
    a console script passes its return value to ``sys.exit``. ``rewrite`` rewords the error's text
    (shard-hydra-train names config keys where the message names flags); ``interrupted``: what is true
    after Ctrl-C or SIGTERM (shard-train resumes rather than redoes)."""
    return functools.partial(_wrap, prog=prog, rewrite=rewrite, interrupted=interrupted)


def _wrap(fn, prog: str, rewrite: Optional[Callable[[str], str]] = None, interrupted: str = _NOTHING_HALF_WRITTEN):
    @functools.wraps(fn)
    def wrapper(argv=None):
        try:
            with answering_signals(prog, interrupted):
                result = fn(sys.argv[1:] if argv is None else list(argv))
            return None if argv is None else result
        except ShardtrainError as e:
            print(f"{prog}: error: {rewrite(str(e)) if rewrite else e}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)

    return wrapper


@contextlib.contextmanager
def answering_signals(prog: str, then: str = _NOTHING_HALF_WRITTEN):
    """Ctrl-C or SIGTERM within the block: the clean-up on the way out runs, then one line (ending in ``then``),
    exit 130 / 143."""
    try:
        with sigterm_raises():
            yield
    except BaseException as e:
        signal_error = _signal_behind(e)
        if isinstance(signal_error, KeyboardInterrupt):
            _stop(prog, "interrupted (Ctrl-C / SIGINT)", EXIT_INTERRUPTED, then)
        if isinstance(signal_error, Terminated):
            _stop(prog, "terminated by SIGTERM", EXIT_TERMINATED, then)
        raise


def _signal_behind(error: BaseException):
    """The KeyboardInterrupt or Terminated that ``error`` is, or that it was raised while handling:
    a signal inside torch.save makes its zip writer's clean-up fail with a RuntimeError of its own."""
    while error is not None and not isinstance(error, (KeyboardInterrupt, Terminated)):
        error = error.__cause__ or error.__context__
    return error


def _stop(prog: str, what: str, status: int, then: str = _NOTHING_HALF_WRITTEN) -> None:
    print(f"{prog}: {what} before it finished; {then}.", file=sys.stderr)
    sys.exit(status)


@contextlib.contextmanager
def sigterm_raises():
    """Within the block SIGTERM raises :class:`Terminated`: Python's default is to die at once,
    skipping every clean-up (temporary files, staging directories) and saying nothing.
    Handlers set inside the block (shard-train's preemption watcher) take precedence."""
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
