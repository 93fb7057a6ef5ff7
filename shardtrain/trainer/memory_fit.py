"""Refuse, before anything is allocated, a model whose state cannot fit this machine.

``--decoder-layers 100000`` used to build for minutes and then fail with an
allocation traceback; ``--tokens-per-sample 1000000000`` tried to allocate
128 GB of positions. The estimate is this rank's parameters, gradients and
optimizer state (divided over the ranks where the backend shards them) and
buffers (the sinusoidal positions), from the model built on the meta device
(no memory), placed and divided as shard-plan places them (trainer/rank_memory.py). A model whose
config names its repeated layers
(``repeated_layers_field`` on the model class) is built with one and two
layers and extrapolated, as a meta build of 100,000 layers still takes minutes.
The activations are what autograd keeps from the model's forward of one
sequence of --tokens-per-sample tokens (a lower bound of the batch's: the loss's
own are not counted, nor dropout's masks), counted on the same meta builds
through saved-tensor hooks. Only the model runs, in eval mode and with the RNG
state restored after, so counting changes nothing a run does (a criterion may
count its calls; layerdrop and dropout would draw random numbers).
--spike-rollback's snapshot is a copy of the parameters, buffers and optimizer state, each beside
what it copies. --async-save keeps a pinned host copy of the state each rank holds on its GPU for the
whole run (rank_memory.staged_bytes): without it counted, a run passed this check and ran out of host
memory at its first save. The host's free memory is MemAvailable, or less under a cgroup limit (host_memory.py).
Only what certainly cannot fit is refused: the activations of one sequence only,
none under --checkpoint-activations, and an optimizer whose spec does not say its
state bytes (OptimizerSpec.state_bytes) counts none.
"""
import dataclasses
import logging
import os
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.overrides import TorchFunctionMode

from shardtrain.core.errors import ConfigError
from shardtrain.models.capabilities import repeated_layers_field
from shardtrain.trainer.build import optimizer_spec
from shardtrain.trainer.host_memory import host_memory
from shardtrain.trainer.launch.threads import local_ranks
from shardtrain.trainer.rank_memory import RunFacts, place, run_facts, staged_bytes
from shardtrain.trainer.resolved import Components
from shardtrain.trainer.parallel.activation_checkpointing import checkpoint_every

logger = logging.getLogger(__name__)
GIB = 2 ** 30
# Host bytes per parameter tensor beyond its data, measured on the CPU with torch 2.13 (3,000 blocks
# of transformer_lm): 2.9 KB building the module, 0.4 KB its gradient, 2.6 KB Adam's two moments.
# 100,000 small blocks hold 1.2M parameter tensors: 7 GB of it, more than their numbers.
BYTES_PER_TENSOR = 5 * 1024


@dataclasses.dataclass
class Estimate:
    """Bytes one rank holds."""
    params: int
    grads: int
    optimizer: int
    buffers: int
    bookkeeping: int  # host memory of the module and tensor objects themselves
    activations: int = 0  # saved by one forward of one sequence (0: not counted)
    snapshots: int = 0  # --spike-rollback keeps one (trainer/spike.py); none without it
    staged: int = 0  # host memory --async-save's stager holds for the run (rank_memory.staged_bytes)

    @property
    def snapshot(self) -> int:
        """A snapshot's copy of the parameters and optimizer state (kept where they are)."""
        return self.snapshots * (self.params + self.optimizer)

    @property
    def snapshot_buffers(self) -> int:
        """A snapshot's copy of the buffers (kept where they are: on the GPU even under --cpu-offload)."""
        return self.snapshots * self.buffers

    @property
    def state(self) -> int:
        return self.params + self.grads + self.optimizer


def model_sizes(cfg, components: Components, task, activations: bool = False) -> Tuple[int, int, int, int]:
    """(parameter count, buffer bytes, parameter tensors, activation bytes) of the model ``cfg``
    describes, built on the meta device; the activations (fp32) are counted when ``activations``."""
    rest, per_layer, layers = _by_layer(cfg, components, task, task.max_positions() if activations else None)
    return tuple(a + layers * b for a, b in zip(rest, per_layer))


def block_share(cfg, components: Components, task) -> float:
    """The share of the model's parameters in its repeated layers (the blocks FSDP shards as units of their own;
    the rest, embeddings and output projection, is the root's); 1.0 for a model that names no repeated layers."""
    rest, per_layer, layers = _by_layer(cfg, components, task)
    total = rest[0] + layers * per_layer[0]
    return layers * per_layer[0] / total if layers and total else 1.0


def _by_layer(cfg, components: Components, task, length: Optional[int] = None):
    """(sizes of all but the repeated layers, sizes of one of them, how many), each as ``_meta_sizes`` counts:
    from meta builds with one and two layers (the model as it is where it names none: all "rest"). Deep models
    are never built whole: building 100,000 layers even on the meta device takes minutes."""
    model_cls = components.model
    layers_field = repeated_layers_field(model_cls)
    layers = cfg.model[layers_field] if layers_field else None
    if not layers:
        return _meta_sizes(model_cls, cfg.model, task, length), (0, 0, 0, 0), 0
    one, two = (_meta_sizes(model_cls, _with(cfg.model, layers_field, n), task, length) for n in (1, 2))
    per_layer = tuple(b - a for a, b in zip(one, two))
    return tuple(a - b for a, b in zip(one, per_layer)), per_layer, layers


def one_layer_config(cfg, components: Components):
    """``cfg.model`` with its repeated layers (if the model names them) cut to one: what a quick meta build of
    the model needs, as building 100,000 layers even on the meta device takes minutes and gigabytes."""
    layers_field = repeated_layers_field(components.model)
    if not layers_field or cfg.model[layers_field] <= 1:
        return cfg.model
    return _with(cfg.model, layers_field, 1)


def _with(model_cfg, key: str, value: int):
    changed = OmegaConf.to_container(model_cfg)
    changed[key] = value
    return OmegaConf.merge(OmegaConf.structured(OmegaConf.get_type(model_cfg)), changed)


def _meta_sizes(model_cls, model_cfg, task, length: Optional[int] = None) -> Tuple[int, int, int, int]:
    """``length``: count the activations of one sequence this long (None: not counted)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # the RNG as it was, for the run
        model = task.build_model(model_cls, model_cfg)
        activations = _saved_bytes(model, length) if length else 0
    return (sum(p.numel() for p in model.parameters()),
            sum(b.numel() * b.element_size() for b in model.buffers()), len(list(model.parameters())), activations)


class _FusedAttention(TorchFunctionMode):
    """On the meta device F.scaled_dot_product_attention runs its math path, which keeps the length x
    length probabilities and copies of q, k and v that the fused kernels a run uses never store: route it
    to the CPU flash kernel's op (its meta version saves q, k, v, the output and the log-sum-exp, as CPU
    and CUDA flash attention do)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            mask, dropout, causal = (list(args[3:6]) + [None, 0.0, False][len(args[3:6]):])
            mask, dropout = kwargs.get("attn_mask", mask), kwargs.get("dropout_p", dropout)
            causal = kwargs.get("is_causal", causal)
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, dropout, causal, attn_mask=mask, scale=kwargs.get("scale"))[0]
        return func(*args, **kwargs)


def _saved_bytes(model, length: int) -> int:
    """Bytes autograd keeps from the forward of one ``length``-token sequence on the meta model (attention
    as the fused kernels keep it: _FusedAttention): each saved tensor's storage once, parameters left out.
    A model that cannot run on meta or takes other inputs (a plugin's) counts 0."""
    params = {id(p) for p in model.parameters()}
    seen: Dict[int, torch.Tensor] = {}  # by id of the storage's owner, kept alive so ids are not reused

    def pack(t: torch.Tensor):
        owner = t if t._base is None else t._base
        if id(owner) not in params:
            seen.setdefault(id(owner), owner)
        return t

    model.eval()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _FusedAttention():
            model(torch.zeros(1, length, dtype=torch.long, device="meta"))
    except Exception as e:  # noqa: BLE001 - any failure only means the activations go uncounted
        logger.info(f"activations not estimated: the model's forward could not run on the meta device ({e})")
        return 0
    return sum(t.numel() * t.element_size() for t in seen.values())


def estimate(cfg, components: Components, task, param_bytes: int, shards: int, optimizer_shards: int,
             activations: bool = False,
             compute_bytes: int = 4) -> Estimate:
    """This rank's bytes: parameters stored in ``param_bytes`` each (2 under
    --memory-efficient-fp16), split over ``shards`` ranks (the optimizer state over ``optimizer_shards``);
    with ``activations``, those of one sequence in ``compute_bytes`` per value (none are counted under
    --checkpoint-activations: what it keeps depends on where it cuts)."""
    d = cfg.distributed
    count, buffers, tensors, saved = model_sizes(
        cfg, components, task, activations and checkpoint_every(d) is None)
    spec = optimizer_spec(cfg, components, torch.device("cpu"))
    state = spec.state_bytes + spec.master_bytes(param_bytes)
    return Estimate(params=count * param_bytes // shards, grads=count * param_bytes // shards,
                    optimizer=count * state // optimizer_shards, buffers=buffers,
                    snapshots=1 if cfg.optimization.spike_rollback else 0,
                    bookkeeping=tensors * BYTES_PER_TENSOR, activations=saved * compute_bytes // 4)


def host_available_bytes(root: str = "/") -> int:
    """The host memory this process may still use: MemAvailable, or less under a cgroup memory limit
    (trainer/host_memory.py); ``root``: where /proc and /sys are (tests)."""
    return host_memory(root).available


def memory_needs(est: Estimate, device: torch.device, ranks_on_host: int, state_on_host: bool,
                 optimizer_on_host: Optional[bool] = None) -> Dict[str, int]:
    """{"host": bytes, "device": bytes} ``est`` needs, placed as shard-plan places it (rank_memory.place):
    the buffers and activations on the rank's GPU, the state there too unless ``state_on_host``
    (--cpu-offload; the optimizer's also when ``optimizer_on_host``: an optimizer stepping in CPU memory);
    the host is shared by ``ranks_on_host`` ranks. A CPU run needs everything on the host. A
    --spike-rollback snapshot lies beside what it copies; --async-save's staged copy (``est.staged``) is
    host memory."""
    kinds = {"params": est.params, "grads": est.grads, "optimizer": est.optimizer, "buffers": est.buffers,
             "bookkeeping": est.bookkeeping, "activations": est.activations}
    needs = place(kinds, device.type, state_on_host, state_on_host if optimizer_on_host is None else optimizer_on_host,
                  snapshot=est.snapshots > 0)
    needs["host"] = (needs["host"] + est.staged) * ranks_on_host
    if device.type == "cpu":
        del needs["device"]
    return needs


def check_fits(est: Estimate, device: torch.device, ranks_on_host: int, state_on_host: bool,
               available: Optional[Dict[str, int]] = None, host_source: str = "MemAvailable",
               optimizer_on_host: Optional[bool] = None) -> None:
    """Refuse ``est`` when it exceeds the free memory of this rank's GPU or of the host (``memory_needs``).
    ``available``: {"host": bytes, "device": bytes}, measured when None (tests pass it, and
    ``host_source``: which limit gave the host's bytes, for the message)."""
    if available is None:
        host = host_memory()
        available, host_source = {"host": host.available}, host.source
        if device.type == "cuda":
            available["device"] = torch.cuda.mem_get_info(device)[0]
    for where, need in memory_needs(est, device, ranks_on_host, state_on_host, optimizer_on_host).items():
        if where in available and need > available[where]:
            raise ConfigError(_message(est, where, need, available[where], ranks_on_host, host_source))


def check_run_fits(cfg, components: Components, task, backend, dtypes) -> None:
    """The run's estimate (see ``estimate``), checked against this machine; ``dtypes``: the run's
    (precision.run_dtypes), as the backend received them."""
    ranks = ranks_on_this_host(backend.world_size)
    facts = run_facts(cfg, components, backend.world_size, ranks, backend=type(backend))
    try:
        est = run_estimate(cfg, components, task, facts, backend.device.type,
                           compute_bytes=dtypes.compute.itemsize if dtypes.compute else 4)
    except (RuntimeError, NotImplementedError) as e:  # a plugin's model that cannot be built on meta
        logger.info(f"memory not estimated: the model could not be built on the meta device ({e})")
        return
    check_fits(est, backend.device, ranks, state_on_host=facts.state_on_host,
               optimizer_on_host=facts.optimizer_on_host)


def run_estimate(cfg, components: Components, task, facts: RunFacts, device_type: str,
                 compute_bytes: int = 4) -> Estimate:
    """One rank's estimate of the run ``facts`` describe, on a ``device_type`` device, with what --async-save
    stages in host memory."""
    est = estimate(cfg, components, task, param_bytes=facts.param_bytes, shards=facts.shards,
                   optimizer_shards=facts.shards * facts.zero_shards, activations=True, compute_bytes=compute_bytes)
    # estimate's optimizer bytes hold the master copies too: both are host or device as the optimizer is
    est.staged = staged_bytes(facts, {"params": est.params, "optimizer": est.optimizer, "master": 0}, device_type)
    return est


def ranks_on_this_host(world_size: int) -> int:
    """Ranks sharing this machine's memory: torchrun's and SLURM's count, else all (spawned here)."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return local_ranks(os.environ, "torchrun")
    if "SLURM_PROCID" in os.environ:
        return local_ranks(os.environ, "slurm")
    return world_size


def _message(est: Estimate, where: str, need: int, free: int, ranks: int, host_source: str) -> str:
    memory = f"host memory available ({host_source})" if where == "host" else f"free memory of the {where}"
    per = f" per rank, {ranks} ranks on this machine" if where == "host" and ranks > 1 else " for this rank"
    if est.buffers > max(est.state, est.activations):  # the sinusoidal positions: --tokens-per-sample long
        fix = "a smaller --tokens-per-sample (or --max-target-positions): the positions are precomputed for every one"
    elif est.activations > est.state:
        fix = ("--checkpoint-activations (only each layer's input is kept; the rest is recomputed in the backward), "
               "a smaller --tokens-per-sample, or fewer --decoder-layers")
    else:
        fix = ("fewer --decoder-layers or a smaller --decoder-embed-dim/--decoder-ffn-embed-dim, --ddp-backend "
               "fully_sharded over more ranks (it divides parameters, gradients and optimizer state by the number "
               "of ranks), --cpu-offload on a GPU, or --optimizer cpu_adam --fp16-adam-stats")
        if est.snapshot:
            fix += ("; or leave out --spike-rollback (its snapshot is a second copy of the parameters, buffers "
                    "and optimizer state)")
    if where == "host" and est.staged:
        fix += ("; or leave out --async-save (it keeps a pinned host copy of each rank's state on the GPU for the "
                "whole run; --cpu-offload's state is written live, not copied)")
    activations = (f"activations of one sequence {est.activations / GIB:.1f} GiB" if est.activations else
                   "activations not counted")
    snapshot = est.snapshot + est.snapshot_buffers
    snapshot = f", --spike-rollback's snapshot {snapshot / GIB:.1f}" if snapshot else ""
    if where == "host" and est.staged:
        snapshot += f", --async-save's host copy of the state {est.staged / GIB:.1f}"
    return (f"The model cannot fit: it needs about {need / GIB:.1f} GiB{per} (parameters {est.params / GIB:.1f}, "
            f"gradients {est.grads / GIB:.1f}, optimizer state {est.optimizer / GIB:.1f}, buffers such as the "
            f"positions {est.buffers / GIB:.1f}{snapshot}, tensor bookkeeping {est.bookkeeping / GIB:.1f} GiB; "
            f"{activations}), "
            f"but the {memory} is {free / GIB:.1f} GiB. Make it fit with {fix}.")
