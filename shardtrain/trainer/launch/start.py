"""Start the ranks of a run and give each its torch.distributed process group.

fairseq's ``call_main``, on torch.distributed's own launch conventions:

1. started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
   join its group through ``env://``; main runs once, in this process;
2. started by ``srun`` with several tasks: rank and world size from SLURM's
   variables, ``tcp://`` to the first node of the step; main runs once, here;
3. otherwise, world size > 1: spawn the ranks on this machine; they meet
   through a file in a fresh temporary directory (no TCP port to collide on);
4. world size 1: no process group; main runs in this process (a backend that needs
   a group even there, FSDP2's mesh, gets a 1-rank one: ``one_rank_group``).
"""
import dataclasses
import logging
import multiprocessing.connection
import os
import pickle
import signal
import tempfile
import time
import traceback
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardtrain.core.errors import ConfigError, ShardtrainError
from shardtrain.core.fileio import atomic_write_bytes, remove_quietly
from shardtrain.trainer.launch import rendezvous
from shardtrain.trainer.launch import threads
from shardtrain.trainer.launch import peer_lost
from shardtrain.trainer.launch import waiting
from shardtrain.trainer.metrics.logging_setup import setup_logging
from shardtrain.trainer.launch.preemption import StoppedWhileStarting, answer_signal, forwarding_signals

logger = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class DistributedContext:
    """Where this rank sits: what main needs to place its model and shard its data."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device  # cuda:<local_rank> when training on CUDA, else cpu
    backend: Optional[str]  # None when world_size == 1: there is no process group

    @property
    def is_master(self) -> bool:
        return self.rank == 0


class RankFailedError(RuntimeError):
    """A spawned rank raised an exception that is not a user error: a bug, so its traceback is kept."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


def call_main(cfg, main: Callable[[Any, DistributedContext], Any]) -> Any:
    """Run ``main(cfg, ctx)`` on every rank and return rank 0's result (in the process that called it).

    ``main`` must be a module-level function (it is pickled when ranks are
    spawned) and return something picklable. Under torchrun or SLURM this
    process is one rank, and gets its own rank's result.
    """
    use_cuda = training_on_cuda(cfg)
    launched = rendezvous.from_environment(os.environ, cfg.distributed.distributed_init_method)
    if launched is not None:
        return _run_launched(cfg, main, launched, use_cuda)
    gpu_count = torch.cuda.device_count() if use_cuda else 0
    world_size = resolve_world_size(cfg.distributed.distributed_world_size, use_cuda, gpu_count)
    if world_size == 1:
        setup_logging(cfg.common.log_file, 0)
        return _run_rank(cfg, main, make_context(0, 0, 1, use_cuda, backend=None), "", launcher=None)
    return _spawn(cfg, main, world_size, use_cuda)


def training_on_cuda(cfg) -> bool:
    return not cfg.common.cpu and torch.cuda.is_available()


def resolve_world_size(requested: Optional[int], use_cuda: bool, gpu_count: int) -> int:
    """``--distributed-world-size``, defaulting to every visible GPU (1 on the CPU)."""
    if requested is None:
        return gpu_count if use_cuda else 1
    if requested < 1:
        raise ConfigError(f"--distributed-world-size must be at least 1, got {requested}. "
                          "Pass the number of processes to train with, or leave it out.")
    if use_cuda and requested > gpu_count:
        raise ConfigError(
            f"--distributed-world-size {requested} asks for one process per GPU, but only {gpu_count} "
            f"GPU{'' if gpu_count == 1 else 's'} {'is' if gpu_count == 1 else 'are'} visible. Pass "
            f"--distributed-world-size {gpu_count} or less, check CUDA_VISIBLE_DEVICES, or add --cpu to "
            "train on the CPU with gloo.")
    return requested


def make_context(rank: int, local_rank: int, world_size: int, use_cuda: bool,
                 backend: Optional[str]) -> DistributedContext:
    if not use_cuda:
        return DistributedContext(rank, local_rank, world_size, torch.device("cpu"), backend)
    gpu_count = torch.cuda.device_count()
    if local_rank >= gpu_count:
        raise ConfigError(
            f"Rank {rank} has local rank {local_rank}, but only {gpu_count} GPU(s) are visible to it, so it "
            "has no GPU of its own. Start at most one process per visible GPU on each node "
            "(--nproc-per-node, --ntasks-per-node, CUDA_VISIBLE_DEVICES; under SLURM every task must see all "
            "GPUs of its node, so use --gres=gpu:N rather than --gpus-per-task), or add --cpu.")
    return DistributedContext(rank, local_rank, world_size, torch.device("cuda", local_rank), backend)


def _run_launched(cfg, main, launched: rendezvous.LaunchedRank, use_cuda: bool) -> Any:
    setup_logging(cfg.common.log_file, launched.rank)
    requested = cfg.distributed.distributed_world_size
    if requested is not None and requested != launched.world_size:
        logger.warning("%s started %d processes; --distributed-world-size %d is ignored",
                       launched.launcher, launched.world_size, requested)
    if launched.launcher == "torchrun" and cfg.distributed.distributed_init_method:
        logger.warning("under torchrun the group is joined through env://; --distributed-init-method is ignored")
    backend = None
    if launched.world_size > 1:
        backend = rendezvous.resolve_backend(cfg.distributed.distributed_backend, use_cuda)
    ctx = make_context(launched.rank, launched.local_rank, launched.world_size, use_cuda, backend)
    return _run_rank(cfg, main, ctx, launched.init_method, launcher=launched.launcher)


def _run_rank(cfg, main, ctx: DistributedContext, init_method: str, launcher: Optional[str],
              spawned_ranks: int = 1, on_joined: Callable[[], None] = lambda: None) -> Any:
    """Call main inside this rank's process group (none for a single rank); ``on_joined`` once in it."""
    # Every launcher's ranks come through here: the one place the thread policy is applied.
    threads.apply_threads(cfg.common.threads, ctx.rank, launcher, spawned_ranks)
    # The rank's GPU is the current device before anything else runs, with or without a process group:
    # code that asks for the current device (the RNG state, tensors made on "cuda") then finds it, and
    # DeviceMesh (which FSDP builds even on one GPU) keeps it instead of guessing one from LOCAL_RANK or
    # the rank (with a "device not set" warning).
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    if ctx.backend is None:
        return main(cfg, ctx)
    timeout = rendezvous.process_group_timeout(cfg.distributed.heartbeat_timeout)
    if launcher is not None and ctx.rank == 0:  # spawned ranks: the launching process says it (waiting.py)
        logger.info(f"waiting at the rendezvous ({init_method}) for all {ctx.world_size} ranks {launcher} started "
                    "to join the process group")
    try:
        store = rendezvous.attempt_store(os.environ, init_method, ctx.rank, ctx.world_size, timeout)
        dist.init_process_group(backend=rendezvous.process_group_backend(ctx.backend),
                                init_method=None if store else init_method, store=store,
                                rank=ctx.rank, world_size=ctx.world_size, timeout=timeout)
    except RuntimeError as e:  # DistStoreError is one
        missing = rendezvous.as_rendezvous_error(e, ctx.world_size, init_method, cfg.distributed.heartbeat_timeout)
        if missing is None:
            raise
        raise missing from None
    on_joined()
    try:
        result = main(cfg, ctx)
    except Exception as e:  # a peer's loss may come wrapped (a checkpoint writer's own exception)
        timeout = rendezvous.as_timeout_error(e, cfg.distributed.heartbeat_timeout)
        lost = peer_lost.as_peer_lost_error(e, ctx.rank, ctx.world_size)  # another rank died
        if timeout is None and lost is None:
            raise
        raise (timeout or lost) from None
    # Only on success: after a failure the process is ending anyway, and shutting
    # down a group whose peers still wait in a collective can block. Every rank past its last
    # collective first: a gloo rank that tore its connections down while a peer still received
    # (rank 0 gathering the final weights) aborted that peer (SIGABRT; 1 run in 10 in such a test).
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return result


@dataclasses.dataclass(frozen=True)
class _SpawnPlan:
    """What every spawned rank needs besides cfg and main (pickled to each child)."""

    world_size: int
    backend: str
    init_method: str
    use_cuda: bool
    run_dir: str  # results and failure reports; also the rendezvous file by default
    started: float  # time.time() when the launcher spawned the ranks


def _spawn(cfg, main, world_size: int, use_cuda: bool) -> Any:
    backend = rendezvous.resolve_backend(cfg.distributed.distributed_backend, use_cuda)
    processes = []  # filled once started: the signal handlers stop what is there
    try:
        with tempfile.TemporaryDirectory(prefix="shardtrain-ranks-") as run_dir:
            init_method = cfg.distributed.distributed_init_method or "file://" + os.path.join(run_dir, "rendezvous")
            plan = _SpawnPlan(world_size, backend, init_method, use_cuda, run_dir, time.time())
            watch = waiting.StartWatch(run_dir, world_size, backend)
            if not use_cuda:  # said before a single process starts: 64 ranks on 2 cores started none in minutes
                crowded = threads.oversubscription_warning(world_size, threads.usable_cores())
                if crowded:
                    watch.warn(crowded)
            # Installed before the ranks start: Ctrl-C or SIGTERM before they have all joined stops them at once
            # (there is nothing to save yet), and is answered as the signal, not as a rank killed by it.
            with forwarding_signals(processes, starting=lambda: not watch.done) as signals:
                context = mp.start_processes(_spawned_rank, args=(cfg, main, plan), nprocs=world_size,
                                             join=False, start_method="spawn")
                processes.extend(context.processes)
                _supervise(context, run_dir, watch, first=lambda: (signals.check(), watch.begin(init_method)))
            return _read_result(run_dir)
    except StoppedWhileStarting as stopped:  # the ranks are stopped, the handlers are the command's again
        answer_signal(stopped.signum)


def _spawned_rank(rank: int, cfg, main, plan: _SpawnPlan) -> None:
    """Body of each spawned process (torch.multiprocessing passes the rank first)."""
    try:
        waiting.mark(plan.run_dir, "started", rank)
        setup_logging(cfg.common.log_file, rank)
        logger.info(f"started {plan.world_size} ranks ({plan.backend}) in {time.time() - plan.started:.1f} s")
        ctx = make_context(rank, rank, plan.world_size, plan.use_cuda, plan.backend)
        result = _run_rank(cfg, main, ctx, plan.init_method, launcher=None, spawned_ranks=plan.world_size,
                           on_joined=lambda: waiting.mark(plan.run_dir, "joined", rank))
        # Every rank marks that main returned: a rank that exits 0 without it was
        # cut short (torch.multiprocessing turns Ctrl-C into exit code 0).
        atomic_write_bytes(_result_path(plan.run_dir, rank), pickle.dumps(result if rank == 0 else None))
    except Exception as e:
        _report_failure(plan.run_dir, rank, e)
        raise  # torch.multiprocessing then exits non-zero


def _report_failure(run_dir: str, rank: int, error: Exception) -> None:
    error_class = None
    if isinstance(error, ShardtrainError):
        try:
            error_class = pickle.dumps(type(error))  # bytes: the parent may fail to import the class
        except Exception:  # noqa: BLE001 - a class pickle cannot find by name; the base class will do
            error_class = pickle.dumps(ShardtrainError)
    report = {"time": time.time(), "error_class": error_class, "message": str(error),
              "traceback": traceback.format_exc(), "peer_lost": isinstance(error, peer_lost.PeerLostError)}
    atomic_write_bytes(_report_path(run_dir, rank), pickle.dumps(report))


def _supervise(context, run_dir: str, watch: Optional[waiting.StartWatch] = None,
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


def _read_result(run_dir: str) -> Any:
    with open(_result_path(run_dir, 0), "rb") as f:  # present: _supervise checked every rank's
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
