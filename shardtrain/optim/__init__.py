"""Optimizers and learning-rate schedulers, chosen by --optimizer and --lr-scheduler."""
from shardtrain.optim.registry import (
    LR_SCHEDULER_REGISTRY,
    OPTIMIZER_REGISTRY,
    OptimizerSpec,
    register_lr_scheduler,
    register_optimizer,
)

# Imported for their registrations only.
from shardtrain.optim import adafactor, cpu_adam, lr_scheduler, nag, optimizers  # noqa: F401, E402

__all__ = [
    "LR_SCHEDULER_REGISTRY",
    "OPTIMIZER_REGISTRY",
    "OptimizerSpec",
    "register_lr_scheduler",
    "register_optimizer",
]
