"""Entry-point wrapper: user mistakes become one paragraph and a non-zero exit."""
import functools
import sys

from shardtrain.core.errors import ShardtrainError

EXIT_USER_ERROR = 2


def cli_entry(prog: str):
    """Decorate a ``main(argv)``: a ShardtrainError prints ``PROG: error: ...``
    (no traceback) and exits 2; anything else is a bug and keeps its traceback.

    Called with an explicit ``argv`` (from Python), the wrapper returns main's
    result; called as a console script (``argv=None``) it returns None, since
    a console script passes its return value to ``sys.exit``."""
    return functools.partial(_wrap, prog=prog)


def _wrap(fn, prog: str):
    @functools.wraps(fn)
    def wrapper(argv=None):
        try:
            result = fn(sys.argv[1:] if argv is None else list(argv))
            return None if argv is None else result
        except ShardtrainError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)

    return wrapper
