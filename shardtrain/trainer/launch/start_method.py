"""How the launcher starts the ranks of a run on this machine: from a forkserver for CPU ranks, by spawn for CUDA ones.

A spawned rank is a fresh interpreter that imports torch and shardtrain before it can do anything: seconds of one core
each. A forkserver imports them once and forks every rank from that state. ``python benchmarks/rank_start.py``
(2026-12-03, 2 idle cores, a 2-rank CPU shard-train of 5 updates, medians of 3 rounds): 22.5 s of CPU spawned,
16.9 s forked; the wall 14.99 s against 14.71 s, since two spawned ranks import side by side on two cores. On a
machine with fewer cores than ranks, where CPU runs live, that is the difference.

CUDA ranks keep ``spawn``: the server only imports, but a module that asked the driver anything while being imported
(``torch.cuda.is_available()`` without NVML's check initialises the runtime) would leave every forked rank unable to
use CUDA ("Cannot re-initialize CUDA in forked subprocess"), and a GPU node has the cores to import in parallel.

Each launch starts its own server and stops it once its ranks have ended. A server lives as long as it is not stopped
and keeps what it had when it started: the environment, and the stdout and stderr its ranks then write to
(multiprocessing hands each child only the launcher's sys.path and working directory of the moment). A process that
launches several runs (a test session, a notebook, a sweep in one script) would otherwise give a later run's ranks an
earlier run's environment and output. Started per launch, a rank inherits what a spawned one would.

A forked rank lets go of the launcher's liveness pipe first (``let_go_of_the_launcher``). multiprocessing hands
every child of the server the write end of the pipe by which the server sees its launcher alive, so that the
child could use the server in turn. A rank never does; holding it, the ranks kept the server alive after the
launcher died (SIGKILL, the OOM killer), and with it themselves: a rank's parent-death signal (SIGINT, set by
torch.multiprocessing) comes only when its parent, the server, ends. Seen 2026-12-03: two ranks trained on for
20 minutes after their launcher was killed. Let go, the server ends with the launcher and the ranks get SIGINT, as
spawned ranks do when their launcher dies.
"""
import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
from typing import Callable, Iterator

# Imported by the server once, before it forks the ranks: torch, and this package's rank entry point (with what it
# imports: torch.distributed, logging, the supervisor's reports).
PRELOAD = ["torch", "shardtrain.trainer.launch.start"]


@contextlib.contextmanager
def rank_start(use_cuda: bool, main: Callable) -> Iterator[str]:
    """The start method for one launch's ranks (torch.multiprocessing's name for it). Under ``forkserver`` the
    server is this launch's own: started with the ranks, stopped on the way out, when they have ended."""
    # The standard library has no public way to stop a forkserver or ask whether one runs: ``_stop`` is what its own
    # tests use (Python 3.8-3.14). Without it, or beside a server someone else started, the ranks are spawned.
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    if use_cuda or not hasattr(server, "_stop") or getattr(server, "_forkserver_pid", None) is not None:
        yield "spawn"
        return
    # main's own module too (not the command's: each rank runs that as __mp_main__, and runpy warns when it is
    # already imported under its own name)
    module = getattr(getattr(main, "func", main), "__module__", None)
    extra = [module] if module and module not in ("__main__", "__mp_main__") else []
    multiprocessing.set_forkserver_preload(PRELOAD + extra)
    try:
        yield "forkserver"
    finally:  # the ranks have ended (supervise stops what is left)
        end_forkserver()


def end_forkserver() -> None:
    """End this process's forkserver, if it started one, and reap it (the tests' own servers end this way too).
    Ended, not asked: _stop() closes the lifeline and waits for the server, which ends only when no process holds
    the lifeline's other end, and a child stopped before it let go (let_go_of_the_launcher) would keep this process
    waiting. The server is this process's unreaped child: its pid cannot have been reused."""
    server = multiprocessing.forkserver._forkserver
    with contextlib.suppress(OSError, TypeError):  # TypeError: no pid, the server never started
        os.kill(server._forkserver_pid, signal.SIGTERM)
    with contextlib.suppress(OSError):  # a server killed with its children is gone already
        server._stop()


def let_go_of_the_launcher() -> None:
    """First thing in a rank: close the server's liveness pipe if this process was forked from one (a spawned rank
    holds none). Private attributes again (``_serve_one`` sets them in every forked child, Python 3.8-3.14)."""
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.close(fd)
    server._forkserver_alive_fd = None
    server._forkserver_address = None  # a server started from this rank would be its own
