"""The configurations a user weighs against the one asked for: each a set of config overrides that
shard-train's flags express, so a recommendation prints as flags to add."""
import dataclasses
import itertools
from typing import Any, List, Tuple

from omegaconf import OmegaConf

from shardtrain.config.overridden import with_overrides
from shardtrain.config.sections import chosen_precision
from shardtrain.trainer.parallel.activation_checkpointing import checkpoint_every
from shardtrain.trainer.parallel.choose import backend_class

PRECISIONS = {
    "fp32": {},
    "bf16": {"common.bf16": True},
    "fp16": {"common.fp16": True},
}
_NO_PRECISION = {"common.fp16": False, "common.bf16": False, "common.amp": False,
                 "common.memory_efficient_fp16": False, "common.memory_efficient_bf16": False}
# config key -> flag, for printing overrides as a command line
FLAGS = {
    "distributed.ddp_backend": "--ddp-backend", "distributed.zero_sharding": "--zero-sharding",
    "distributed.fsdp_sharding_strategy": "--fsdp-sharding-strategy", "distributed.cpu_offload": "--cpu-offload",
    "distributed.checkpoint_activations": "--checkpoint-activations", "common.bf16": "--bf16",
    "common.fp16": "--fp16", "common.amp": "--amp", "common.memory_efficient_fp16": "--memory-efficient-fp16",
    "common.memory_efficient_bf16": "--memory-efficient-bf16", "optimizer.fp16_adam_stats": "--fp16-adam-stats",
}


@dataclasses.dataclass(frozen=True)
class Option:
    label: str
    overrides: Tuple[Tuple[str, Any], ...]

    def apply(self, cfg):
        return with_overrides(cfg, dict(self.overrides))


def as_given() -> Option:
    return Option("as given", ())


def alternatives(cfg, world_size: int, ranks_per_node: int, device: str) -> List[Option]:
    """Backends (pytorch_ddp, with ZeRO's sharded optimizer state, fully_sharded, hybrid across
    nodes), --cpu-offload (on GPUs), activation checkpointing, fp32/bf16/fp16 and, for cpu_adam,
    --fp16-adam-stats."""
    backends = [("pytorch_ddp", {"distributed.ddp_backend": "pytorch_ddp", "distributed.zero_sharding": "none",
                                 "distributed.cpu_offload": False})]
    if world_size > 1:
        backends.append(("pytorch_ddp + zero os", {"distributed.ddp_backend": "pytorch_ddp",
                                                   "distributed.zero_sharding": "os", "distributed.cpu_offload": False}))
    fsdp = {"distributed.ddp_backend": "fully_sharded", "distributed.zero_sharding": "none",
            "distributed.fsdp_sharding_strategy": "full_shard", "distributed.cpu_offload": False}
    backends.append(("fully_sharded", fsdp))
    if world_size > ranks_per_node:
        backends.append(("fully_sharded hybrid", {**fsdp, "distributed.fsdp_sharding_strategy": "hybrid_shard"}))
    if device == "cuda":
        backends += [(f"{label} + offload", {**o, "distributed.cpu_offload": True})
                     for label, o in list(backends) if backend_class(o["distributed.ddp_backend"]).supports_cpu_offload]
    # --fp16-adam-stats is an option of the optimizer's own config (cpu_adam's), not a flag of every optimizer
    stats = [False, True] if "fp16_adam_stats" in cfg.optimizer else [None]
    options = []
    for (label, backend), checkpoint, precision, fp16_stats in itertools.product(
            backends, (False, True), PRECISIONS, stats):
        overrides = {**backend, "distributed.checkpoint_activations": checkpoint, **_NO_PRECISION,
                     **PRECISIONS[precision]}
        if fp16_stats is not None:
            overrides["optimizer.fp16_adam_stats"] = fp16_stats
        words = [label, precision] + (["checkpointed"] if checkpoint else []) + (["fp16 stats"] if fp16_stats else [])
        options.append(Option(", ".join(words), tuple(overrides.items())))
    return options


def flags_to_add(base, option: Option) -> List[str]:
    """``option``'s overrides that change ``base``, as shard-train flags (a flag to drop as "no --x")."""
    out = []
    for key, value in option.overrides:
        if OmegaConf.select(base, key) == value:
            continue
        flag = FLAGS[key]
        if isinstance(value, bool):
            out.append(flag if value else f"(drop {flag})")
        else:
            out.append(f"{flag} {value}")
    return out


def trace_key(cfg) -> Tuple:
    """What the traced step depends on: the backend class it is prepared with (one that keeps the parameters
    whole is traced on one rank: single_process, unless it wraps a single rank itself); ZeRO, DDP's flavour and
    --cpu-offload are added analytically."""
    d, cls = cfg.distributed, backend_class(cfg.distributed.ddp_backend)
    sharded = cls.shards_parameters
    return (cls if sharded or cls.wraps_a_single_rank else None, d.fsdp_sharding_strategy if sharded else None,
            checkpoint_every(d) is not None, chosen_precision(cfg.common),
            OmegaConf.select(cfg, "optimizer.fp16_adam_stats"))
