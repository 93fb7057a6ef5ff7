"""The data-parallel backend interface.

The trainer holds one backend and never branches on which it is. A backend
wraps the model, says how gradients are reduced, skips communication on
accumulation steps, computes the global gradient norm and reduces scalars.
Backends are registered by name (``--ddp-backend`` picks one); each lives in
its own file.
"""
import contextlib
from typing import Iterable, Optional

import torch
from torch import nn

from shardtrain.registry import Registry

BACKEND_REGISTRY = Registry("ddp_backend", flag="--ddp-backend")


class Backend:
    rank: int = 0
    world_size: int = 1
    #: True when the wrapped model averages gradients over ranks (DDP), so the
    #: loss must be multiplied by world_size to get a sum.
    grads_are_averaged: bool = False

    def __init__(self, device: torch.device):
        self.device = device

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, module: nn.Module):
        """Context for accumulation steps: no gradient communication."""
        return contextlib.nullcontext()

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def grad_norm(self, params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
        """Norm of the full (unsharded) gradient."""
        grads = [p.grad for p in params if p.grad is not None]
        return torch.nn.utils.get_total_norm(grads, foreach=True)

    def clip_grads(self, params, max_norm: float, total_norm: torch.Tensor) -> None:
        # takes the parameters (it scales their .grad), unlike get_total_norm above
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm, foreach=True)

    def model_state_dict(self, module: nn.Module):
        return module.state_dict()

    def load_model_state_dict(self, module: nn.Module, state_dict, strict: bool = True):
        return module.load_state_dict(state_dict, strict=strict)

    def barrier(self) -> None:
        pass

    def close(self) -> None:
        pass


def unwrap(module: nn.Module) -> Optional[nn.Module]:
    return getattr(module, "module", module)
