"""A --user-dir plugin for the finite-checkpoint tests: ``adam`` whose ``exp_avg_sq`` has one
sign bit flipped at a chosen update on a chosen rank, as a damaged checkpoint resumed would:
the gradient stays finite, the update itself makes the weights NaN."""
import dataclasses

import torch
import torch.distributed as dist

from shardtrain.core.fields import field
from shardtrain.optim.registry import OptimizerSpec, register_optimizer


@dataclasses.dataclass
class FlipAdamConfig:
    flip_at_update: int = field(5, help="the update (counted from 1 in this process) whose step is damaged")
    flip_rank: int = field(0, help="the rank whose optimizer state is damaged")


class FlipAdam(torch.optim.Adam):
    def __init__(self, params, lr, flip_at_update, flip_rank):
        super().__init__(params, lr=lr, foreach=False)
        self.flip_at_update, self.flip_rank, self.steps = flip_at_update, flip_rank, 0

    @torch.no_grad()
    def step(self, closure=None):
        self.steps += 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        if self.steps == self.flip_at_update and rank == self.flip_rank:
            state = next(iter(self.state.values()))["exp_avg_sq"]
            local = state.to_local() if hasattr(state, "to_local") else state
            local.view(-1)[0] = -local.view(-1)[0] - 1.0  # sqrt of a negative moment is NaN
        return super().step(closure)


@register_optimizer("flip_adam", dataclass=FlipAdamConfig)
def flip_adam(cfg, device):
    return OptimizerSpec(FlipAdam, {"flip_at_update": cfg.flip_at_update, "flip_rank": cfg.flip_rank})
