"""``timed``: a log line before a step that can take a while, and one saying how long it took."""
import contextlib
import logging
import time


@contextlib.contextmanager
def timed(logger: logging.Logger, what: str):
    """Log ``what ...``, run the block, log ``what: done in N s`` (nothing more if the block raises: the
    error says what happened)."""
    logger.info("%s ...", what)
    start = time.perf_counter()
    yield
    logger.info("%s: done in %.1f s", what, time.perf_counter() - start)
