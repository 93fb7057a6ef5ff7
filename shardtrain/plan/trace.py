"""One rank's peak memory in a training step, by kind, from a step run on fake tensors.

The run's own pieces are set up by the trainer's own code, as shard-train sets them up: the run's facts
(``run_facts``) for a fake world of the run's size (beyond many_ranks.TRACE_RANKS, two smaller ones,
scaled; a backend that keeps parameters whole is traced on one rank), its backend (``build_backend``) on a
fake process group, the precision and the model through Run's own assembly (``build.precision_and_model``:
built on the meta device, activation checkpointing, the storage dtype, wrapped or sharded by the backend;
autocast and backward) and the optimizer (``build_optimizer``). Then two updates of --update-freq micro-batches of the run's shape run
on fake tensors (no memory, no compute) under torch's memory tracker; the second update's peak is kept
(the first also creates the optimizer state). The tracker follows one forward per update, so the trace
runs one micro-batch; the gradients that --update-freq keeps between micro-batches are added by
estimate. Nothing is allocated, so a 13B model on 64 ranks is planned on a laptop.

What the tracker cannot see is added by ``shardtrain.plan.estimate`` from the classes' own facts
(trainer/memory/rank_memory.py): a backend's gradient copies (DDP's buckets, legacy_ddp's flat buffer), the
gradients kept between micro-batches, ZeRO's sharding of the optimizer state, and which device each
kind lives on. Models with many identical blocks are traced with three and four blocks and extrapolated
(trainer/memory/layers.py, as the fit check is): a deep model's trace would otherwise take minutes.
"""
import contextlib
import logging
from typing import Dict, Optional

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from shardtrain.core.torch_private import (
    end_process_group, fake_tensor_mode, init_fake_process_group, memory_tracker, outside_fake_tensor_mode,
    reset_tracker_peak, sharding_propagation_untracked,
)
from shardtrain.config.overridden import with_overrides
from shardtrain.plan import many_ranks
from shardtrain.trainer import build
from shardtrain.trainer.launch.start import DistributedContext
from shardtrain.trainer.memory.layers import extrapolated
from shardtrain.trainer.parallel.choose import backend_class, build_backend, chosen_backend_class
from shardtrain.trainer.parallel.activation_checkpointing import checkpoint_every
from shardtrain.trainer.resolved import Components, build_criterion, build_model
from shardtrain.trainer.run_facts import run_facts

CPU = torch.device("cpu")
# torch's tracker kinds -> ours
KINDS = {
    "Parameter": "params", "Sharded Param": "params", "Unsharded Param": "gathered_params",
    "Gradient": "grads", "Sharded Grad": "grads", "Unsharded Grad": "gathered_grads",
    "Optstate": "optimizer", "OptState": "optimizer", "Buffer": "buffers",
    "Activation": "activations", "Inputs": "activations",
    "Temp": "temporaries", "Other": "temporaries", "All Gather": "comm_buffers", "Reduce Scatter": "comm_buffers",
}
EMPTY = {kind: 0 for kind in dict.fromkeys(KINDS.values())}
TRACED_BLOCKS = 3  # deeper models are traced with 3 and 4 blocks and extrapolated


def traced_peak(cfg, task, world_size: int, ranks_per_node: Optional[int] = None) -> Dict[str, int]:
    """Bytes by kind at one rank's peak of a training step of ``cfg`` on ``world_size`` ranks,
    ``ranks_per_node`` a node (default: all on one)."""
    ranks_per_node = ranks_per_node or world_size

    def trace(variant) -> Dict[str, int]:
        return _traced(variant, task, world_size, ranks_per_node)

    if (checkpoint_every(cfg.distributed) or 1) > 1:  # checkpointing every few layers: not a straight line
        return trace(cfg)
    # A line through three and four blocks: the windows a step holds beside its activations (FSDP's gathered blocks,
    # its all-gather and reduce-scatter buffers, the unsharded gradients; forward and backward prefetch) are full
    # only from the third block on, so a line through one and two counts them again for every block (at
    # llama3_1_8b on 8 ranks: 37 GiB a rank where the step holds 24; tests/plan/test_plan_llama_measured.py).
    return {k: max(0, v) for k, v in extrapolated(cfg, Components.of(cfg), trace, base=TRACED_BLOCKS).items()}


def batch_shape(cfg, task):
    """(sequences, tokens each) of one micro-batch: --batch-size, else as many --tokens-per-sample
    blocks as --max-tokens holds."""
    length = task.max_positions() or 512
    sequences = cfg.dataset.batch_size or max(1, (cfg.dataset.max_tokens or 4096) // length)
    return sequences, length


def _traced(cfg, task, world_size: int, ranks_per_node: int) -> Dict[str, int]:
    with _quiet():  # the components' own log lines, once per trace, would bury the plan
        return _trace(cfg, task, world_size, ranks_per_node)


@contextlib.contextmanager
def _quiet():
    log = logging.getLogger("shardtrain")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def _trace(cfg, task, world_size: int, ranks_per_node: int) -> Dict[str, int]:
    # Many ranks are traced on few and scaled (many_ranks): the trace's cost would grow with the ranks.
    sharded = backend_class(cfg.distributed.ddp_backend).shards_parameters
    worlds = (many_ranks.trace_sizes(cfg.distributed, world_size, ranks_per_node) if sharded
              else [many_ranks.TraceSizes(1, None, 1, 1)])
    traced = [_trace_on(cfg, task, sizes) for sizes in worlds]
    return many_ranks.combine([(sizes, kinds) for sizes, (kinds, _) in zip(worlds, traced)], traced[0][1])


def _trace_on(cfg, task, sizes: "many_ranks.TraceSizes"):
    """The kinds at one rank's peak on ``sizes.world`` fake ranks, and the parameters' shard_rows. The
    optimizer is the plain one: ZeRO's sharding of its state is applied by estimate."""
    cfg = with_overrides(cfg, {"distributed.shard_group_size": sizes.group, "distributed.zero_sharding": "none"})
    components = Components.of(cfg)
    ctx = DistributedContext(0, 0, sizes.world, CPU, "fake")
    # the facts of the run traced, as Run decides them: its backend class, dtypes and checkpointing
    facts = run_facts(cfg, components, sizes.world, sizes.world, backend=chosen_backend_class(cfg, ctx))
    criterion = build_criterion(cfg, components, task)
    rows = []

    def build_on_meta():
        with outside_fake_tensor_mode(), torch.device("meta"):  # built for real, holding nothing
            model = build_model(cfg, components, task)
        rows.extend(many_ranks.shard_rows(model))
        model.init_weights = _no_values  # fake tensors hold no values to draw (init_ reads one)
        return model

    fake = fake_tensor_mode()
    with _fake_group(sizes.world), torch.random.fork_rng(devices=[]):
        backend = build_backend(cfg, ctx, facts.dtypes, facts.backend)  # mesh: real
        # Run's own assembly. A backend that materialises the model does so on fake tensors; the others prepare it
        # on meta (torch cannot move or cast a module's fake parameters), given fake tensors after.
        preparing = fake if backend.init_on_meta else contextlib.nullcontext()
        precision, model = build.precision_and_model(cfg, backend, facts, build_on_meta, compile_blocks=False,
                                                     preparing=preparing)
        with fake:
            if any(p.is_meta for p in model.parameters()):
                model.to_empty(device=backend.device)
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = build.build_optimizer(cfg, components, params, backend.optimizer_device)
            peak = _peak_of_two_updates(model, optimizer, criterion, precision,
                                        task.dummy_batch(*batch_shape(cfg, task)))
    out = dict(EMPTY)
    for kind, size in peak.items():
        if kind != "Total":
            out[KINDS[kind.value]] += size
    return out, rows


def _peak_of_two_updates(model, optimizer, criterion, precision, sample) -> Dict:
    """The tracker's kinds at the second update's peak (the first also creates the optimizer state)."""
    tracker = memory_tracker(model, optimizer, fsdp=isinstance(model, FSDPModule))
    with tracker, sharding_propagation_untracked(tracker):  # DTensor's shape propagation allocates nothing
        for update in range(2):  # one micro-batch each (--update-freq: estimate adds the grads kept)
            with precision.autocast():
                loss, _, _ = criterion(model, sample)
            precision.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if update == 0:
                tracker.reset_mod_stats()
                reset_tracker_peak(tracker)  # the second update's peak: the first's sets up what it reuses
    return tracker.get_tracker_snapshot("peak").get(CPU, {})


def _no_values() -> None:
    """A traced model's init_weights."""


@contextlib.contextmanager
def _fake_group(world_size: int):
    """A fake process group of ``world_size`` for the trace, unless one exists (then the trace
    would disturb it: shard-plan runs in a process of its own)."""
    if dist.is_initialized():
        raise RuntimeError("shard-plan traces in a process without a process group")
    init_fake_process_group(world_size)
    try:
        yield
    finally:
        end_process_group()
