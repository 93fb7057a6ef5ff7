"""Named by a callable entry point (``st_ep_plugin.optim:register``): importing
this module registers nothing; calling ``register()`` adds an optimizer."""
import dataclasses

import torch

from shardtrain.core.fields import field
from shardtrain.optim.registry import OPTIMIZER_REGISTRY, OptimizerSpec


@dataclasses.dataclass
class EpSGDConfig:
    ep_momentum: float = field(0.0, help="momentum of the plugin's SGD")


def ep_sgd(cfg, device):
    return OptimizerSpec(torch.optim.SGD, {"momentum": cfg.ep_momentum})


def register():
    OPTIMIZER_REGISTRY.add("ep_sgd", ep_sgd, EpSGDConfig)
