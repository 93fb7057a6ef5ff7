"""Optimizer and learning-rate scheduler registries.

An optimizer entry is a function ``(cfg, device) -> OptimizerSpec``: the torch
optimizer class and its keyword arguments. Returning a spec instead of an
instance lets the trainer build it plainly, or hand the same class and
arguments to ``ZeroRedundancyOptimizer`` for sharded optimizer state.

An lr scheduler entry is a class ``(cfg, optimizer, lrs, max_update)`` (``lrs``:
``--lr``'s values, one per epoch; plus ``maximize=`` for a class with
``follows_validation``) with ``step_begin_epoch``, ``step_update``, ``step``,
``state_dict`` and ``load_state_dict`` (see ``shardtrain.optim.lr_scheduler.base``).
"""
import contextlib
import dataclasses
from typing import Any, Dict, Type

import torch

from shardtrain.core.dtensors import is_dtensor
from shardtrain.core.registry import Registry

OPTIMIZER_REGISTRY = Registry("optimizer")
LR_SCHEDULER_REGISTRY = Registry("lr_scheduler", flag="--lr-scheduler")


@dataclasses.dataclass
class OptimizerSpec:
    cls: Type[torch.optim.Optimizer]
    kwargs: Dict[str, Any]
    # Facts the memory check and shard-plan ask of an optimizer, said by its builder from its config.
    #: Bytes of state kept per parameter (two fp32 moments: 8); a spec that does not say counts none.
    state_bytes: int = 0
    #: True when it steps, and keeps its state, in CPU memory whatever device the parameters are on.
    steps_on_cpu: bool = False

    def master_bytes(self, param_bytes: int) -> int:
        """Bytes per parameter of an fp32 master copy kept for parameters stored in ``param_bytes`` each:
        one that steps in CPU memory keeps one of low-precision parameters."""
        return 4 if self.steps_on_cpu and param_bytes < 4 else 0

    def build(self, params, lr: float) -> torch.optim.Optimizer:
        params = list(params)
        kwargs = dict(self.kwargs)
        if kwargs.get("fused") and self.cls not in _FUSED_ON_DTENSOR and any(is_dtensor(p) for p in params):
            kwargs.pop("fused")
            kwargs["foreach"] = True
        return self.cls(params, lr=lr, **kwargs)


# Fused kernels with a DTensor sharding rule in torch 2.13 (checked: SGD's and
# Adagrad's fused kernels raise NotImplementedError on FSDP2's sharded params,
# so those fall back to foreach there).
_FUSED_ON_DTENSOR = (torch.optim.Adam, torch.optim.AdamW)


def register_optimizer(name: str, dataclass=None, supports_memory_efficient_fp16: bool = False):
    """``supports_memory_efficient_fp16`` (fairseq's name): the optimizer steps parameters stored in fp16/bf16
    (--memory-efficient-fp16/-bf16) in fp32, from fp32 state; the flag checks read it off the registration."""
    register = OPTIMIZER_REGISTRY.register(name, dataclass)

    def decorator(builder):
        builder.supports_memory_efficient_fp16 = supports_memory_efficient_fp16
        return register(builder)
    return decorator


def register_lr_scheduler(name: str, dataclass=None):
    return LR_SCHEDULER_REGISTRY.register(name, dataclass)


@contextlib.contextmanager
def kernel_choice_kept(optimizer: torch.optim.Optimizer):
    """Loading an optimizer state dict also loads the saved run's fused/foreach
    flags, which may not suit this run (another device type, or DTensor shards
    that a fused kernel cannot take); keep this run's choice."""
    kept = [{k: group.get(k) for k in ("fused", "foreach")} for group in optimizer.param_groups]
    yield
    for group, flags in zip(optimizer.param_groups, kept):
        group.update(flags)
