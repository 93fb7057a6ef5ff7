"""A --user-dir plugin: a data-parallel backend and an optimizer, each saying the facts shard-plan and the
memory check need on its own class or spec (nothing elsewhere names them). Each records its use in USED."""
import dataclasses

import torch

from shardtrain.core.fields import field
from shardtrain.optim.registry import OptimizerSpec, register_optimizer
from shardtrain.trainer.parallel.base import BACKEND_REGISTRY, Backend, GradientCopies

USED = {"wrapped": 0, "steps": 0}


@BACKEND_REGISTRY.register("toy_dp")
class ToyBackend(Backend):
    wraps_a_single_rank = True  # used as asked on one rank too, so a one-process run exercises it

    @classmethod
    def plan_variants(cls, name, world_size, ranks_per_node):
        return [(name, {})]  # shard-plan weighs it as it is

    @classmethod
    def gradient_copies(cls, distributed):
        return GradientCopies(during_backward=2)  # e.g. a bucket and a compressed copy of every gradient

    @classmethod
    def bytes_communicated(cls, distributed, world_size, count, dtypes, micro_batches, shards):
        return 3 * count * 4  # three fp32 passes over the gradients per update, whatever the ranks

    def wrap(self, model):
        USED["wrapped"] += 1
        return super().wrap(model)


class ToyMomentum(torch.optim.Optimizer):
    """SGD with an fp32 momentum and an fp16 copy of the last gradient: 6 bytes of state per parameter."""

    def __init__(self, params, lr: float, beta: float):
        super().__init__(params, dict(lr=lr, beta=beta))

    @torch.no_grad()
    def step(self, closure=None):
        USED["steps"] += 1
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["momentum"] = torch.zeros_like(p, dtype=torch.float32)
                    state["last_grad"] = torch.zeros_like(p, dtype=torch.float16)
                state["momentum"].mul_(group["beta"]).add_(p.grad)
                state["last_grad"].copy_(p.grad)
                p.add_(state["momentum"], alpha=-group["lr"])


@dataclasses.dataclass
class ToyMomentumConfig:
    toy_beta: float = field(0.9, help="momentum of the plugin's optimizer")


@register_optimizer("toy_momentum", dataclass=ToyMomentumConfig)
def toy_momentum(cfg, device):
    return OptimizerSpec(ToyMomentum, dict(beta=cfg.toy_beta), state_bytes=6, steps_on_cpu=True)
