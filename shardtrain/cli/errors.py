"""Entry-point wrapper: user mistakes become one paragraph and a non-zero exit."""
import functools
import sys

from shardtrain.errors import ShardtrainError

EXIT_USER_ERROR = 2


def cli_entry(prog: str):
    """Decorate a ``main(argv)``: a ShardtrainError prints ``PROG: error: ...``
    (no traceback) and exits 2; anything else is a bug and keeps its traceback."""
    return functools.partial(_wrap, prog=prog)


def _wrap(fn, prog: str):
    @functools.wraps(fn)
    def wrapper(argv=None):
        try:
            return fn(sys.argv[1:] if argv is None else list(argv))
        except ShardtrainError as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)

    return wrapper
