"""Learning-rate schedulers: the interface and the built-in fairseq 0.12 schedules."""
from shardtrain.optim.lr_scheduler.base import LRScheduler

# Imported for their registration only; each module registers one scheduler.
from shardtrain.optim.lr_scheduler import cosine, fixed, inverse_sqrt, polynomial_decay, tri_stage  # noqa: F401

__all__ = ["LRScheduler"]
