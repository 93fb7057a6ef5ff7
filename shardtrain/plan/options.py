"""The configurations a user weighs against the one asked for: each a set of config overrides that
shard-train's flags express, so a recommendation prints as flags to add."""
import dataclasses
import itertools
from typing import Any, Dict, List, Tuple

from omegaconf import OmegaConf

from shardtrain.config.overridden import with_overrides
from shardtrain.trainer.parallel.activation_checkpointing import checkpoint_every
from shardtrain.trainer.parallel.choose import backend_class, distinct_backends
from shardtrain.trainer.precision.choose import DEFAULT, all_flags, chosen, kinds_with


def precisions() -> Dict[str, Dict[str, Any]]:
    """The precisions shard-plan weighs (those registered as ``planned``), each as the overrides that pick it
    alone: every precision flag cleared (which picks the default), then its own fairseq flag set, or
    ``--precision NAME`` where it has none."""
    cleared = {f"common.{f}": (None if f == "precision" else False) for f in all_flags()}

    def own(k) -> Dict[str, Any]:
        if k.name == DEFAULT:
            return {}
        return {f"common.{k.flags[0]}": True} if k.flags else {"common.precision": k.name}
    return {k.name: {**cleared, **own(k)} for k in kinds_with("planned")}


def _flag(key: str) -> str:
    """The shard-train flag of config key ``key``, for printing overrides as a command line."""
    return "--" + key.rpartition(".")[2].replace("_", "-")


@dataclasses.dataclass(frozen=True)
class Option:
    label: str
    overrides: Tuple[Tuple[str, Any], ...]

    def apply(self, cfg):
        return with_overrides(cfg, dict(self.overrides))


def as_given() -> Option:
    return Option("as given", ())


def alternatives(cfg, world_size: int, ranks_per_node: int, device: str) -> List[Option]:
    """Each backend's own variants (``Backend.plan_variants``: pytorch_ddp, with ZeRO's sharded optimizer state,
    fully_sharded, hybrid across nodes), --cpu-offload where the backend supports it (on GPUs), activation
    checkpointing, the planned precisions and, for an optimizer with the option, --fp16-adam-stats."""
    backends = [(label, {"distributed.ddp_backend": name,
                         **{f"distributed.{key}": value for key, value in overrides.items()},
                         "distributed.cpu_offload": False})
                for name, cls in distinct_backends() for label, overrides in cls.plan_variants(name, world_size,
                                                                                                ranks_per_node)]
    if device == "cuda":
        backends += [(f"{label} + offload", {**o, "distributed.cpu_offload": True})
                     for label, o in list(backends) if backend_class(o["distributed.ddp_backend"]).supports_cpu_offload]
    # --fp16-adam-stats is an option of the optimizer's own config (cpu_adam's), not a flag of every optimizer
    stats = [False, True] if "fp16_adam_stats" in cfg.optimizer else [None]
    options, picks = [], precisions()
    for (label, backend), checkpoint, precision, fp16_stats in itertools.product(
            backends, (False, True), picks, stats):
        overrides = {**backend, "distributed.checkpoint_activations": checkpoint, **picks[precision]}
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
        flag = _flag(key)
        if value is None:
            out.append(f"(drop {flag})")
        elif isinstance(value, bool):
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
            checkpoint_every(d) is not None, chosen(cfg.common).name,
            OmegaConf.select(cfg, "optimizer.fp16_adam_stats"))
