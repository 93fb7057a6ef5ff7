"""One rank's peak memory in a training step, by kind, from a step run on fake tensors.

The run's own pieces are set up as shard-train sets them up (the model built on the meta device,
activation checkpointing, the storage dtype, FSDP2 with the run's mixed precision, offload policy
and mesh over a fake process group of the run's world size (beyond
many_ranks.TRACE_RANKS, two smaller ones, scaled), the run's optimizer), then two updates
of --update-freq micro-batches of the run's shape run on fake tensors (no memory, no compute)
under torch's memory tracker; the second update's peak is kept (the first also creates the
optimizer state). The tracker follows one forward per update, so the trace runs one micro-batch;
the gradients that --update-freq keeps between micro-batches are added by estimate. Nothing is allocated, so a 13B model on 64 ranks is planned on a laptop.

What the tracker cannot see is added by ``shardtrain.plan.estimate``: DDP's gradient buckets,
the gradients kept between micro-batches,
legacy_ddp's flat buffer, ZeRO's sharding of the optimizer state, and which device each kind
lives on. Models with many identical blocks are traced with one and two blocks and extrapolated
(as memory_fit does): a deep model's trace would otherwise take minutes.
"""
import contextlib
import logging
import types
from typing import Dict

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch._subclasses.fake_tensor import FakeTensorMode

from shardtrain.config.components import resolve
from shardtrain.core.torch_private import init_fake_process_group, memory_tracker
from shardtrain.plan import many_ranks
from shardtrain.trainer import build
from shardtrain.trainer.parallel.activation_checkpointing import apply_activation_checkpointing
from shardtrain.trainer.parallel.fsdp_wrap import apply_fsdp, build_mesh, offload_policy, reshards_after_forward
from shardtrain.trainer.precision import mixed_precision, run_dtypes

CPU = torch.device("cpu")
FSDP_BACKENDS = ("fully_sharded",)
# torch's tracker kinds -> ours
KINDS = {
    "Parameter": "params", "Sharded Param": "params", "Unsharded Param": "gathered_params",
    "Gradient": "grads", "Sharded Grad": "grads", "Unsharded Grad": "gathered_grads",
    "Optstate": "optimizer", "OptState": "optimizer", "Buffer": "buffers",
    "Activation": "activations", "Inputs": "activations",
    "Temp": "temporaries", "Other": "temporaries", "All Gather": "comm_buffers", "Reduce Scatter": "comm_buffers",
}
EMPTY = {kind: 0 for kind in dict.fromkeys(KINDS.values())}


def traced_peak(cfg, task, world_size: int) -> Dict[str, int]:
    """Bytes by kind at one rank's peak of a training step of ``cfg`` on ``world_size`` ranks."""
    layers_field = getattr(resolve(cfg.components)["model"].obj, "repeated_layers_field", None)
    layers = cfg.model[layers_field] if layers_field else None
    d = cfg.distributed
    checkpoints_some = (d.checkpoint_activations or d.offload_activations) and d.checkpoint_activations_every > 1
    if not layers or layers <= 2 or checkpoints_some:
        return _traced(cfg, task, world_size)
    one, two = (_traced(_with_model(cfg, layers_field, n), task, world_size) for n in (1, 2))
    return {k: max(0, one[k] + (layers - 1) * (two[k] - one[k])) for k in one}


def _with_model(cfg, key: str, value: int):
    cfg = cfg.copy()
    OmegaConf.set_readonly(cfg, False)
    cfg.model[key] = value
    return cfg


def batch_shape(cfg, task):
    """(sequences, tokens each) of one micro-batch: --batch-size, else as many --tokens-per-sample
    blocks as --max-tokens holds."""
    length = task.max_positions() or 512
    sequences = cfg.dataset.batch_size or max(1, (cfg.dataset.max_tokens or 4096) // length)
    return sequences, length


def _traced(cfg, task, world_size: int) -> Dict[str, int]:
    with _quiet():  # the components' own log lines, once per trace, would bury the plan
        return _trace(cfg, task, world_size)


@contextlib.contextmanager
def _quiet():
    log = logging.getLogger("shardtrain")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def _trace(cfg, task, world_size: int) -> Dict[str, int]:
    # Many ranks are traced on few and scaled (many_ranks): the trace's cost would grow with the ranks.
    sharded = cfg.distributed.ddp_backend in FSDP_BACKENDS
    worlds = (many_ranks.trace_sizes(cfg.distributed, world_size) if sharded
              else [many_ranks.TraceSizes(1, None, 1, 1)])
    traced = [_trace_on(cfg, task, sizes) for sizes in worlds]
    return many_ranks.combine([(sizes, kinds) for sizes, (kinds, _) in zip(worlds, traced)], traced[0][1])


def _trace_on(cfg, task, sizes: "many_ranks.TraceSizes"):
    """The kinds at one rank's peak on ``sizes.world`` fake ranks, and the parameters' shard_rows."""
    d, dtypes = cfg.distributed, run_dtypes(cfg)
    sharded = d.ddp_backend in FSDP_BACKENDS
    criterion = build.build_criterion(cfg, task)
    with _fake_group(sizes.world):
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = build.build_model(cfg, task)
        rows = many_ranks.shard_rows(model)
        if d.checkpoint_activations or d.offload_activations:
            apply_activation_checkpointing(model, d.checkpoint_activations_every, False, CPU)
        if dtypes.storage is not None:
            model = model.to(dtypes.storage)
        if sharded:
            mesh = build_mesh(types.SimpleNamespace(world_size=sizes.world, device=CPU), d.fsdp_sharding_strategy,
                              sizes.group)
            apply_fsdp(model, mesh, mixed_precision(dtypes.compute, d.reduce_in_low_precision),
                       reshard_after_forward=reshards_after_forward(d),
                       offload=offload_policy(d.cpu_offload, CPU), min_params_to_wrap=d.min_params_to_wrap)
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device=CPU)
            optimizer = build.build_optimizer(_unsharded_optimizer(cfg), [p for p in model.parameters()
                                                                           if p.requires_grad], CPU)
            tracker = memory_tracker(model, optimizer, fsdp=sharded)
            sequences, length = batch_shape(cfg, task)
            sample = _fake_sample(sequences, length, len(task.dictionary))
            autocast = dtypes.compute if not sharded and dtypes.storage is None else None
            with tracker:
                for update in range(2):  # one micro-batch each (--update-freq: estimate adds the grads kept)
                    with torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext():
                        loss, _, _ = criterion(model, sample)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if update == 0:
                        tracker.reset_mod_stats()
            peak = tracker.get_tracker_snapshot("peak").get(CPU, {})
    out = dict(EMPTY)
    for kind, size in peak.items():
        if kind != "Total":
            out[KINDS[kind.value]] += size
    return out, rows


def _unsharded_optimizer(cfg):
    """The trace builds the plain optimizer; ZeRO's sharding of its state is applied by estimate."""
    cfg = cfg.copy()
    OmegaConf.set_readonly(cfg, False)
    cfg.distributed.zero_sharding = "none"
    return cfg


def _fake_sample(sequences: int, length: int, vocab: int) -> Dict:
    tokens = torch.randint(4, max(5, vocab), (sequences, length))
    return {"id": torch.arange(sequences), "nsentences": sequences, "ntokens": sequences * length,
            "net_input": {"src_tokens": tokens, "src_lengths": torch.full((sequences,), length)},
            "target": torch.randint(4, max(5, vocab), (sequences, length))}


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
        dist.destroy_process_group()
