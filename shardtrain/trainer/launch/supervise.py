"""Supervising the ranks ``start.py`` spawned: what each leaves in the run directory, and the one error to raise.

Apart from ``start.py`` because it is a job of its own that starting does not need to show: a spawned rank
writes its result (or a failure report) into the launcher's temporary run directory; the launching process
waits on every rank, stops the others at the first failure (SIGTERM, SIGCONT, then SIGKILL), gives ranks that
only lost their peer a grace period, and picks the root cause among ranks that failed at about the same time
(a user error first, then a silent death with its likely cause, then the earliest traceback). All of it is
plain functions of processes and files, tested without starting a rank.
"""
import multiprocessing.connection
import os
import pickle
import signal
import time
import traceback
from typing import Any, Callable, List, Optional

from shardtrain.core.errors import ShardtrainError
from shardtrain.core.fileio import atomic_write_bytes, remove_quietly
from shardtrain.trainer.launch import peer_lost
from shardtrain.trainer.launch import waiting


class RankFailedError(RuntimeError):
    """A spawned rank raised an exception that is not a user error: a bug, so its traceback is kept."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


def write_result(run_dir: str, rank: int, result: Any) -> None:
    """A rank's mark that main returned (rank 0's carries the result): a rank that exits 0 without it was cut
    short (torch.multiprocessing turns Ctrl-C into exit code 0)."""
    atomic_write_bytes(_result_path(run_dir, rank), pickle.dumps(result if rank == 0 else None))


def report_failure(run_dir: str, rank: int, error: Exception) -> None:
    """Called in the rank's ``except``: the error's class (for a user error), message and traceback."""
    error_class = None
    if isinstance(error, ShardtrainError):
        try:
            error_class = pickle.dumps(type(error))  # bytes: the parent may fail to import the class
        except Exception:  # noqa: BLE001 - a class pickle cannot find by name; the base class will do
            error_class = pickle.dumps(ShardtrainError)
    report = {"time": time.time(), "error_class": error_class, "message": str(error),
              "traceback": traceback.format_exc(), "peer_lost": isinstance(error, peer_lost.PeerLostError)}
    atomic_write_bytes(_report_path(run_dir, rank), pickle.dumps(report))


def supervise(context, run_dir: str, watch: Optional[waiting.StartWatch] = None,
              first: Callable[[], Any] = lambda: None) -> None:
    """Wait for every rank; on the first failure stop the others and raise that failure. ``first`` runs
    before the wait, where an exception it raises (a signal's StoppedWhileStarting) stops the ranks too."""
    try:
        first()
        failed = _wait_until_failure_or_done(context.processes, run_dir, watch)
        if failed and all((_read_report(run_dir, rank) or {}).get("peer_lost") for rank in failed):
            failed = _after_lost_peers(context.processes, run_dir, failed)
    finally:
        # After a failure the others may wait in a collective for the failed rank,
        # and after Ctrl-C here nobody would end them: never leave ranks behind.
        _stop(context.processes)
        for path in context.error_files:  # torch.multiprocessing's tracebacks; ours are in run_dir
            remove_quietly(path)
    if failed:
        raise _failure(run_dir, context.processes, failed)


def _wait_until_failure_or_done(processes, run_dir: str, watch: Optional[waiting.StartWatch] = None) -> List[int]:
    """Indices of the ranks that failed on their own, before any rank was stopped by us. ``watch`` is
    polled every second until every rank has joined."""
    while True:
        codes = [p.exitcode for p in processes]  # read once: a rank may exit while we look
        failed = _failed(codes, run_dir)
        running = [p for p, code in zip(processes, codes) if code is None]
        if failed or not running:
            return failed
        watching = watch is not None and not watch.done
        ready = multiprocessing.connection.wait([p.sentinel for p in running], timeout=1.0 if watching else None)
        if watching:
            watch.poll()
        for process in running:
            if process.sentinel in ready:  # it closed its end of the pipe: it is exiting; reap it
                process.join()


def _after_lost_peers(processes, run_dir: str, failed: List[int], grace_s: float = 10.0) -> List[int]:
    """Ranks that only lost their peer are not the cause: the rank that stopped first may still be on its
    way out (its report unwritten, under load); give the others ``grace_s`` to end before stopping them."""
    running = [p for p in processes if p.exitcode is None]
    if running:
        multiprocessing.connection.wait([p.sentinel for p in running], timeout=grace_s)
        time.sleep(0.5)  # the others of the same failure
    for process in running:
        process.join(timeout=0)
    return sorted(set(failed) | set(_failed([p.exitcode for p in processes], run_dir)))


def _failed(codes: List[Optional[int]], run_dir: str) -> List[int]:
    """The ranks that ended by themselves without main returning (exit code 0 from Ctrl-C included)."""
    return [rank for rank, code in enumerate(codes)
            if code is not None and (code != 0 or not os.path.exists(_result_path(run_dir, rank)))]


def _failure(run_dir: str, processes, failed: List[int]) -> Exception:
    """The error to raise for the root cause among ranks that failed at about the same time.

    A rank that dies takes its peers' collectives down with it, so several ranks
    may have failed before we looked: prefer a user error, then a rank that died
    without a Python exception, then the earliest exception. A rank that lost its peer
    (PeerLostError) says only that another rank stopped: it is the cause only when nothing else is.
    """
    reports = {rank: _read_report(run_dir, rank) for rank in failed}
    raised = sorted((r["time"], rank) for rank, r in reports.items() if r is not None)
    silent = [rank for rank in failed if reports[rank] is None]
    causes = [(t, rank) for t, rank in raised if not reports[rank].get("peer_lost")]
    if causes or silent:  # the lost peers are their consequence
        raised = causes
    user_errors = [rank for _, rank in raised if reports[rank]["error_class"] is not None]
    if user_errors:
        return _user_error(user_errors[0], reports[user_errors[0]])
    if silent:
        rank = silent[0]
        return ShardtrainError(
            f"rank {rank} (pid {processes[rank].pid}) stopped without raising an exception: "
            f"{describe_exit(processes[rank].exitcode)}. The other ranks were stopped. Look for the cause in "
            f"rank {rank}'s output above{likely_cause(processes[rank].exitcode)}")
    rank = raised[0][1]
    return RankFailedError(f"rank {rank} failed; the other ranks were stopped. Its traceback:\n\n"
                           f"{reports[rank]['traceback']}", rank)


def _user_error(rank: int, report: dict) -> ShardtrainError:
    message = f"rank {rank}: {report['message']}"
    try:
        error = pickle.loads(report["error_class"])(message)
    except Exception:  # noqa: BLE001 - a class the parent cannot import, or another constructor
        error = ShardtrainError(message)
    return error if isinstance(error, ShardtrainError) else ShardtrainError(message)


def likely_cause(exitcode: int) -> str:
    """What a rank's silent death by this exit code usually means (the end of the message)."""
    if exitcode == -signal.SIGKILL:
        return ("; SIGKILL usually means the system ran out of memory (lower --batch-size/--max-tokens or "
                "--distributed-world-size).")
    if exitcode == -signal.SIGABRT:
        # NCCL's watchdog aborts the process when a collective times out: Python never sees an
        # exception, so this is where the user learns about the hung peer.
        return ("; on GPUs SIGABRT usually means NCCL's watchdog ended the rank because a collective waited "
                "more than --heartbeat-timeout for another rank (a hung, suspended or lost rank: the job was "
                "stopped and its checkpoints are intact, so relaunching the same command resumes; raise "
                "--heartbeat-timeout if the ranks are only slow), otherwise a CUDA or C++ error the output names.")
    return "."


def describe_exit(exitcode: int) -> str:
    if exitcode == 0:
        return "exit code 0 before its main returned (sys.exit(0), os._exit(0) or Ctrl-C in that process)"
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode} (os._exit or sys.exit, a crash in native code, or a failure while starting)"


def _stop(processes, grace_s: float = 30.0) -> None:
    """SIGTERM (a rank blocked in a collective dies at once), then SIGKILL after a grace period.

    SIGCONT follows the SIGTERM: a stopped rank (SIGSTOP, Ctrl-Z, a debugger,
    a cluster's suspend) would otherwise hold its SIGTERM pending until the
    grace period ran out."""
    for process in processes:
        if process.is_alive():
            process.terminate()
            try:
                os.kill(process.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def read_result(run_dir: str) -> Any:
    with open(_result_path(run_dir, 0), "rb") as f:  # present: supervise() checked every rank's
        return pickle.load(f)


def _read_report(run_dir: str, rank: int) -> Optional[dict]:
    try:
        with open(_report_path(run_dir, rank), "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None


def _result_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"result-rank{rank}.pkl")


def _report_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"failure-rank{rank}.pkl")
