"""Start the ranks of a run and give each its torch.distributed process group.

fairseq's ``call_main``, on torch.distributed's own launch conventions:

1. started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT):
   join its group through ``env://``; main runs once, in this process;
2. started by ``srun`` with several tasks: rank and world size from SLURM's
   variables, ``tcp://`` to the first node of the step; main runs once, here;
3. otherwise, world size > 1: start the ranks on this machine (start_method.py); they meet
   through a file in a fresh temporary directory (no TCP port to collide on);
4. world size 1: no process group; main runs in this process (a backend that needs
   a group even there, FSDP2's mesh, gets a 1-rank one: ``one_rank_group``).

Watching the spawned ranks, stopping them and choosing the error to raise: ``supervise.py``.
"""
import dataclasses
import logging
import os
import tempfile
import time
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardtrain.core.errors import ConfigError
from shardtrain.core.torch_private import end_process_group
from shardtrain.trainer.launch import rendezvous
from shardtrain.trainer.launch import start_method
from shardtrain.trainer.launch import supervise
from shardtrain.trainer.launch import threads
from shardtrain.trainer.launch import peer_lost
from shardtrain.trainer.launch import waiting
from shardtrain.trainer.metrics.logging_setup import setup_logging
from shardtrain.trainer.launch.preemption import StoppedWhileStarting, answer_signal, forwarding_signals
from shardtrain.trainer.launch.supervise import RankFailedError  # noqa: F401 - what call_main raises for a rank's bug

logger = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class DistributedContext:
    """Where this rank sits: what main needs to place its model and shard its data."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device  # cuda:<local_rank> when training on CUDA, else cpu
    backend: Optional[str]  # None when world_size == 1: there is no process group
    # Ranks sharing this node (its memory, a hybrid shard group): counted once, here, by the rule the thread
    # policy uses (threads.local_ranks: torchrun's LOCAL_WORLD_SIZE, else SLURM's); 0 when every rank is local.
    ranks_per_node: int = 0
    # Spawned by shard-train's own launcher, which passes each Ctrl-C on to its ranks (preemption.py).
    spawned: bool = False

    def __post_init__(self):
        if self.ranks_per_node <= 0:
            object.__setattr__(self, "ranks_per_node", self.world_size)

    @property
    def is_master(self) -> bool:
        return self.rank == 0


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
                 backend: Optional[str], ranks_per_node: int = 0) -> DistributedContext:
    """``ranks_per_node``: as the launcher counts them (``launched_context``); 0: all ``world_size`` (a spawn)."""
    if not use_cuda:
        return DistributedContext(rank, local_rank, world_size, torch.device("cpu"), backend, ranks_per_node)
    gpu_count = torch.cuda.device_count()
    if local_rank >= gpu_count:
        raise ConfigError(
            f"Rank {rank} has local rank {local_rank}, but only {gpu_count} GPU(s) are visible to it, so it "
            "has no GPU of its own. Start at most one process per visible GPU on each node "
            "(--nproc-per-node, --ntasks-per-node, CUDA_VISIBLE_DEVICES; under SLURM every task must see all "
            "GPUs of its node, so use --gres=gpu:N rather than --gpus-per-task), or add --cpu.")
    return DistributedContext(rank, local_rank, world_size, torch.device("cuda", local_rank), backend, ranks_per_node)


def launched_context(launched: rendezvous.LaunchedRank, use_cuda: bool, backend: Optional[str]) -> DistributedContext:
    """The context of a rank torchrun or SLURM started: its node's ranks as that launcher counts them (torchrun's
    wins inside a SLURM allocation, whose SLURM_NTASKS_PER_NODE counts torchrun agents, not ranks)."""
    per_node = min(threads.local_ranks(os.environ, launched.launcher), launched.world_size)
    return make_context(launched.rank, launched.local_rank, launched.world_size, use_cuda, backend, per_node)


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
    ctx = launched_context(launched, use_cuda, backend)
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
        end_process_group()
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
        with tempfile.TemporaryDirectory(prefix="shardtrain-ranks-") as run_dir, \
                start_method.rank_start(use_cuda, main) as method:
            init_method = cfg.distributed.distributed_init_method or "file://" + os.path.join(run_dir, "rendezvous")
            plan = _SpawnPlan(world_size, backend, init_method, use_cuda, run_dir, time.time())
            watch = waiting.StartWatch(run_dir, world_size, backend, forked=method == "forkserver")
            if not use_cuda:  # said before a single process starts: 64 ranks on 2 cores started none in minutes
                crowded = threads.oversubscription_warning(world_size, threads.usable_cores())
                if crowded:
                    watch.warn(crowded)
            # Installed before the ranks start: Ctrl-C or SIGTERM before they have all joined stops them at once
            # (there is nothing to save yet), and is answered as the signal, not as a rank killed by it.
            with forwarding_signals(processes, starting=lambda: not watch.done) as signals:
                context = mp.start_processes(_spawned_rank, args=(cfg, main, plan), nprocs=world_size,
                                             join=False, start_method=method)
                processes.extend(context.processes)
                supervise.supervise(context, run_dir, watch,
                                    first=lambda: (signals.check(), watch.begin(init_method)))
            return supervise.read_result(run_dir)
    except StoppedWhileStarting as stopped:  # the ranks are stopped, the handlers are the command's again
        answer_signal(stopped.signum)


def _spawned_rank(rank: int, cfg, main, plan: _SpawnPlan) -> None:
    """Body of each spawned process (torch.multiprocessing passes the rank first)."""
    start_method.let_go_of_the_launcher()
    try:
        waiting.mark(plan.run_dir, "started", rank)
        setup_logging(cfg.common.log_file, rank)
        logger.info(f"started {plan.world_size} ranks ({plan.backend}) in {time.time() - plan.started:.1f} s")
        ctx = dataclasses.replace(make_context(rank, rank, plan.world_size, plan.use_cuda, plan.backend),
                                  spawned=True)
        result = _run_rank(cfg, main, ctx, plan.init_method, launcher=None, spawned_ranks=plan.world_size,
                           on_joined=lambda: waiting.mark(plan.run_dir, "joined", rank))
        supervise.write_result(plan.run_dir, rank, result)  # every rank's: the mark that main returned
    except Exception as e:
        supervise.report_failure(plan.run_dir, rank, e)
        raise  # torch.multiprocessing then exits non-zero

