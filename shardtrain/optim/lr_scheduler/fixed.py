"""``fixed``: a constant lr with optional linear warmup and per-epoch annealing (fairseq 0.12)."""
import dataclasses
from typing import Optional

from shardtrain.config.epoch_lists import for_epoch
from shardtrain.core.fields import field
from shardtrain.optim.lr_scheduler.base import LRScheduler, check_warmup_updates, require
from shardtrain.optim.registry import register_lr_scheduler


@dataclasses.dataclass
class FixedLRScheduleConfig:
    force_anneal: Optional[int] = field(None, help="force annealing at specified epoch")
    lr_shrink: float = field(0.1, help="shrink factor for annealing, lr_new = (lr * lr_shrink)")
    warmup_updates: int = field(0, help="warmup the learning rate linearly for the first N updates")


@register_lr_scheduler("fixed", dataclass=FixedLRScheduleConfig)
class FixedLRSchedule(LRScheduler):
    """Constant ``--lr``, annealed from epoch ``--force-anneal`` on.

    At the beginning of epoch ``e`` (counted from 1)::

        lr_e = lr[min(e, len(lr)) - 1]                       if e < force_anneal (or it is unset)
        lr_e = lr[-1] * lr_shrink ** (e + 1 - force_anneal)  otherwise

    (``--lr 0.1,0.05`` gives each epoch its own; one --lr is a list of one), so
    epoch ``force_anneal`` itself already runs at ``lr * lr_shrink``, as in fairseq 0.12 (0.10 started one epoch later). During warmup, after update ``n``
    (``n < warmup_updates``) the lr is ``lr_e * (n + 1) / warmup_updates``.
    """

    state_attrs = LRScheduler.state_attrs + ("lr", "warmup_factor")
    takes_lr_list = True

    def __init__(self, cfg, optimizer, lr, max_update):
        super().__init__(cfg, optimizer, lr, max_update)
        check_warmup_updates("fixed", cfg.warmup_updates)
        require(cfg.force_anneal is None or cfg.force_anneal >= 1,
                f"--force-anneal is {cfg.force_anneal}; it is the epoch (counted from 1) at which annealing "
                "starts. Pass an epoch >= 1, or leave it unset to keep the lr fixed.")
        self.warmup_updates = cfg.warmup_updates
        self.lr = self.peak_lr  # this epoch's lr, before warmup scaling
        self.warmup_factor = 1.0 / self.warmup_updates if self.warmup_updates > 0 else 1.0
        self.step_update(0)

    def epoch_lr(self, epoch: int) -> float:
        anneal_from = self.cfg.force_anneal
        if anneal_from is None or epoch < anneal_from:
            return for_epoch(self.lrs, epoch)
        return self.lrs[-1] * self.cfg.lr_shrink ** (epoch + 1 - anneal_from)

    def step_begin_epoch(self, epoch: int) -> float:
        self.lr = self.epoch_lr(epoch)
        self.set_lr(self.warmup_factor * self.lr)
        return self.get_lr()

    def step_update(self, num_updates: int) -> float:
        if self.warmup_updates > 0 and num_updates < self.warmup_updates:
            self.warmup_factor = (num_updates + 1) / float(self.warmup_updates)
            self.set_lr(self.warmup_factor * self.lr)
        else:
            self.set_lr(self.lr)
        return self.get_lr()
