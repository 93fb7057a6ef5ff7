"""``inverse_sqrt``: linear warmup, then decay with the inverse square root of the update (fairseq 0.12)."""
import dataclasses

from shardtrain.core.fields import field
from shardtrain.optim.lr_scheduler.base import LRScheduler, require
from shardtrain.optim.registry import register_lr_scheduler


@dataclasses.dataclass
class InverseSquareRootLRScheduleConfig:
    warmup_updates: int = field(4000, help="warmup the learning rate linearly for the first N updates")
    warmup_init_lr: float = field(-1.0, help="initial learning rate during warmup phase (-1: 0)")


@register_lr_scheduler("inverse_sqrt", dataclass=InverseSquareRootLRScheduleConfig)
class InverseSquareRootSchedule(LRScheduler):
    """Warm up linearly from ``--warmup-init-lr`` to ``--lr``, then decay so the two meet::

        n <  warmup_updates:  lr_n = warmup_init_lr + n * (lr - warmup_init_lr) / warmup_updates
        n >= warmup_updates:  lr_n = lr * sqrt(warmup_updates) / sqrt(n)

    ``--warmup-init-lr`` -1 (the default) means 0. The lr is a function of the
    update count alone, so resuming only needs ``num_updates``.
    """

    def __init__(self, cfg, optimizer, lr, max_update):
        super().__init__(cfg, optimizer, lr, max_update)
        # fairseq divides by zero here; with no warmup the decay factor would be 0 as well.
        require(cfg.warmup_updates > 0,
                f"--lr-scheduler inverse_sqrt needs --warmup-updates > 0 (got {cfg.warmup_updates}): the decay "
                "lr * sqrt(warmup_updates / n) is anchored at the end of warmup. Pass e.g. --warmup-updates 4000, "
                "or use --lr-scheduler fixed for a constant lr.")
        self.warmup_updates = cfg.warmup_updates
        self.warmup_init_lr = cfg.warmup_init_lr if cfg.warmup_init_lr >= 0 else 0.0
        self.lr_step = (self.peak_lr - self.warmup_init_lr) / self.warmup_updates
        self.decay_factor = self.peak_lr * self.warmup_updates ** 0.5
        self.step_update(0)

    def step_update(self, num_updates: int) -> float:
        if num_updates < self.warmup_updates:
            lr = self.warmup_init_lr + num_updates * self.lr_step
        else:
            lr = self.decay_factor * num_updates ** -0.5
        self.set_lr(lr)
        return lr
