"""Learning-rate schedulers: the interface and the built-in fairseq 0.12 schedules."""
from shardtrain.optim.lr_scheduler.base import LRScheduler

# Imported for their registration only; each module registers one scheduler.
from shardtrain.optim.lr_scheduler import (  # noqa: F401
    cosine, fixed, inverse_sqrt, polynomial_decay, reduce_lr_on_plateau, tri_stage)

__all__ = ["LRScheduler"]
