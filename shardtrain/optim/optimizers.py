"""The built-in optimizers: fairseq's flag names and defaults, torch's implementations.

Each entry maps its config to an :class:`OptimizerSpec` (a torch optimizer
class and its keyword arguments); the trainer calls ``spec.build(params, lr)``.
Where torch has a fused kernel for the optimizer on the training device we ask
for it (a few kernel launches per step instead of a Python loop over
parameters), otherwise for the multi-tensor ``foreach`` implementation.
"""
import dataclasses
import inspect
from typing import Dict, Tuple, Type

import torch

from shardtrain.core.fields import field
from shardtrain.core.errors import ConfigError
from shardtrain.optim.cpu_adam import CPUAdam
from shardtrain.optim.optim_config import (  # noqa: F401 (parse_float_tuple: the optimizers' flag parsing)
    AdamConfig, check_non_negative, parse_betas, parse_float_tuple,
)
from shardtrain.optim.registry import OptimizerSpec, register_optimizer

# Device types on which torch (>= 2.4) ships a fused kernel for these optimizers.
# A table rather than a probe: torch validates the device only at the first
# step(), so constructing an optimizer with fused=True proves nothing.
_FUSED_DEVICE_TYPES: Dict[Type[torch.optim.Optimizer], Tuple[str, ...]] = {
    torch.optim.Adam: ("cpu", "cuda"),
    torch.optim.AdamW: ("cpu", "cuda"),
    torch.optim.SGD: ("cpu", "cuda"),
    torch.optim.Adagrad: ("cpu", "cuda"),
}


def implementation_kwargs(cls: Type[torch.optim.Optimizer], device: torch.device) -> Dict[str, bool]:
    """``{"fused": True}`` where torch has a fused kernel for ``cls`` on ``device``'s type,
    else ``{"foreach": True}``."""
    device_type = torch.device(device).type
    accepts_fused = "fused" in inspect.signature(cls).parameters
    if accepts_fused and device_type in _FUSED_DEVICE_TYPES.get(cls, ()):
        return {"fused": True}
    return {"foreach": True}


def _spec(cls: Type[torch.optim.Optimizer], device: torch.device, state_bytes: int, **kwargs) -> OptimizerSpec:
    """``state_bytes``: what it keeps per parameter (OptimizerSpec.state_bytes)."""
    return OptimizerSpec(cls, {**kwargs, **implementation_kwargs(cls, device)}, state_bytes=state_bytes)


@dataclasses.dataclass
class FairseqAdamConfig(AdamConfig):
    use_old_adam: bool = field(False, help="use the plain (for-each) Adam implementation, not the fused kernel "
                               "(fairseq: fairseq.optim.adam.Adam instead of fused Adam)")
    fp16_adam_stats: bool = field(False, help="use FP16 stats (with automatic scaling); on the CPU this steps with "
                                  "cpu_adam's fp16 moments (fairseq has it only with CUDA's fused Adam)")


# fp16/bf16 parameters step in fp32 through cpu_adam.for_fp16_parameters, as fairseq's adam does
@register_optimizer("adam", dataclass=FairseqAdamConfig, supports_memory_efficient_fp16=True)
def adam(cfg, device: torch.device) -> OptimizerSpec:
    """fairseq's ``adam`` decays weights decoupled from the gradient, i.e. it is AdamW."""
    check_non_negative(cfg, "adam_eps", "weight_decay")
    cls = torch.optim.AdamW if cfg.adamw_mode else torch.optim.Adam
    kwargs = dict(betas=parse_betas(cfg.adam_betas, "--adam-betas"), eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    if cfg.fp16_adam_stats:
        return _fp16_stats_adam(cls, device, kwargs)
    if cfg.use_old_adam:
        return OptimizerSpec(cls, dict(kwargs, foreach=True), state_bytes=8)
    return _spec(cls, device, 8, **kwargs)  # two fp32 moments


def _fp16_stats_adam(cls, device: torch.device, kwargs) -> OptimizerSpec:
    if torch.device(device).type != "cpu":
        raise ConfigError("--optimizer adam --fp16-adam-stats keeps fp16 moments with cpu_adam's kernel, which steps "
                          f"in CPU memory, but this run trains on {torch.device(device).type}. Use --optimizer cpu_adam "
                          "--fp16-adam-stats (its state in CPU memory), or drop --fp16-adam-stats.")
    return OptimizerSpec(CPUAdam, dict(kwargs, adamw_mode=cls is torch.optim.AdamW, fp16_adam_stats=True),
                         state_bytes=4, steps_on_cpu=True)  # two fp16 moments


@dataclasses.dataclass
class AdamWConfig:
    adam_betas: Tuple[float, float] = field((0.9, 0.999), help="betas for Adam optimizer")
    adam_eps: float = field(1e-8, help="epsilon for Adam optimizer")
    # torch.optim.AdamW's default, not fairseq adam's 0.0: asking for adamw means asking for decay.
    weight_decay: float = field(0.01, help="decoupled weight decay")


@register_optimizer("adamw", dataclass=AdamWConfig)
def adamw(cfg, device: torch.device) -> OptimizerSpec:
    check_non_negative(cfg, "adam_eps", "weight_decay")
    return _spec(torch.optim.AdamW, device, 8, betas=parse_betas(cfg.adam_betas, "--adam-betas"), eps=cfg.adam_eps,
                 weight_decay=cfg.weight_decay)


@dataclasses.dataclass
class SGDConfig:
    momentum: float = field(0.0, help="momentum factor")
    weight_decay: float = field(0.0, help="weight decay", aliases=("--wd",))


@register_optimizer("sgd", dataclass=SGDConfig)
def sgd(cfg, device: torch.device) -> OptimizerSpec:
    check_non_negative(cfg, "momentum", "weight_decay")
    return _spec(torch.optim.SGD, device, 4 if cfg.momentum else 0, momentum=cfg.momentum,
                 weight_decay=cfg.weight_decay)


@dataclasses.dataclass
class AdagradConfig:
    weight_decay: float = field(0.0, help="weight decay", aliases=("--wd",))


@register_optimizer("adagrad", dataclass=AdagradConfig)
def adagrad(cfg, device: torch.device) -> OptimizerSpec:
    check_non_negative(cfg, "weight_decay")
    return _spec(torch.optim.Adagrad, device, 4, weight_decay=cfg.weight_decay)


@dataclasses.dataclass
class AdadeltaConfig:
    adadelta_rho: float = field(0.9, help="coefficient used for computing a running average of squared gradients")
    adadelta_eps: float = field(1e-6, help="term added to the denominator to improve numerical stability")
    weight_decay: float = field(0.0, help="weight decay")


@register_optimizer("adadelta", dataclass=AdadeltaConfig)
def adadelta(cfg, device: torch.device) -> OptimizerSpec:
    check_non_negative(cfg, "adadelta_eps", "weight_decay")
    if not 0.0 <= cfg.adadelta_rho <= 1.0:
        raise ConfigError(f"--adadelta-rho is {cfg.adadelta_rho}, but it must be in [0, 1]. The default is 0.9.")
    return _spec(torch.optim.Adadelta, device, 8, rho=cfg.adadelta_rho, eps=cfg.adadelta_eps,
                 weight_decay=cfg.weight_decay)


@dataclasses.dataclass
class AdamaxConfig:
    adamax_betas: Tuple[float, float] = field((0.9, 0.999), help="betas for Adamax optimizer")
    adamax_eps: float = field(1e-8, help="epsilon for Adamax optimizer")
    weight_decay: float = field(0.0, help="weight decay, added to the gradient as L2 (torch.optim.Adamax)")


@register_optimizer("adamax", dataclass=AdamaxConfig)
def adamax(cfg, device: torch.device) -> OptimizerSpec:
    """torch's Adamax. Unlike fairseq's own Adamax, its weight decay is L2 on the
    gradient, not decoupled; with the default --weight-decay 0 they agree."""
    check_non_negative(cfg, "adamax_eps", "weight_decay")
    return _spec(torch.optim.Adamax, device, 8, betas=parse_betas(cfg.adamax_betas, "--adamax-betas"),
                 eps=cfg.adamax_eps, weight_decay=cfg.weight_decay)
