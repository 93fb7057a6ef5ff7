"""Entry-point wrapper: user mistakes become one paragraph and a non-zero exit."""
import functools
import sys
import textwrap

from shardtrain.errors import ShardtrainError

EXIT_USER_ERROR = 2


def cli_entry(fn):
    """Decorate a ``main(argv=None)``: a ShardtrainError prints ``error: ...``
    (no traceback) and exits 2; anything else is a bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(argv=None):
        try:
            return fn(sys.argv[1:] if argv is None else list(argv))
        except ShardtrainError as e:
            prog = fn.__module__.rsplit(".", 1)[-1]
            message = textwrap.fill(f"error: {e}", width=100, break_long_words=False, break_on_hyphens=False)
            print(f"shard-{prog}: {message}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)

    return wrapper
