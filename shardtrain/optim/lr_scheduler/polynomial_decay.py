"""``polynomial_decay``: linear warmup, then polynomial decay to an end lr (fairseq 0.12)."""
import dataclasses
from typing import Optional

from shardtrain.core.fields import field
from shardtrain.optim.lr_scheduler.base import LRScheduler, check_warmup_updates, require
from shardtrain.optim.registry import register_lr_scheduler


@dataclasses.dataclass
class PolynomialDecayLRScheduleConfig:
    warmup_updates: int = field(0, help="warmup the learning rate linearly for the first N updates")
    force_anneal: Optional[int] = field(None, help="force annealing at specified epoch")
    end_learning_rate: float = field(0.0, help="learning rate to decay to")
    power: float = field(1.0, help="decay exponent")
    total_num_update: Optional[int] = field(
        None, help="total number of updates over which to decay learning rate (default: --max-update)")


@register_lr_scheduler("polynomial_decay", dataclass=PolynomialDecayLRScheduleConfig)
class PolynomialDecayLRSchedule(LRScheduler):
    """With ``W = warmup_updates``, ``T = total_num_update`` (default ``--max-update``)
    and ``base`` this epoch's lr (``--lr``), after update ``n``::

        n <= W:      lr_n = base * n / W
        n >= T:      lr_n = end_learning_rate
        otherwise:   lr_n = (base - end) * (1 - (n - W) / (T - W)) ** power + end

    The first update therefore runs at lr 0 when warming up, as in fairseq. From
    epoch ``--force-anneal`` on, ``base`` becomes the lr the optimizer holds at the
    start of each epoch, so the decay restarts from there (fairseq 0.12's rule).
    """

    state_attrs = LRScheduler.state_attrs + ("lr", "warmup_factor")

    def __init__(self, cfg, optimizer, lr, max_update):
        super().__init__(cfg, optimizer, lr, max_update)
        check_warmup_updates("polynomial_decay", cfg.warmup_updates)
        self.total_num_update = cfg.total_num_update or self.max_update
        require(self.total_num_update > 0,
                "--lr-scheduler polynomial_decay needs the number of updates to decay over, but neither "
                "--total-num-update nor --max-update is set to a positive number. Pass --max-update N "
                "(or --total-num-update N to decay over a different length).")
        require(cfg.warmup_updates <= self.total_num_update,
                f"--warmup-updates {cfg.warmup_updates} is longer than the decay schedule "
                f"(--total-num-update/--max-update {self.total_num_update}). Lower --warmup-updates or raise "
                "--total-num-update.")
        self.warmup_updates = cfg.warmup_updates
        self.lr = self.peak_lr  # the base lr the decay starts from
        self.warmup_factor = 1.0 / self.warmup_updates if self.warmup_updates > 0 else 1.0
        self.step_update(0)

    def step_begin_epoch(self, epoch: int) -> float:
        anneal_from = self.cfg.force_anneal
        self.lr = self.peak_lr if anneal_from is None or epoch < anneal_from else self.get_lr()
        self.set_lr(self.warmup_factor * self.lr)
        return self.get_lr()

    def step_update(self, num_updates: int) -> float:
        warmup, total, end = self.warmup_updates, self.total_num_update, self.cfg.end_learning_rate
        if warmup > 0 and num_updates <= warmup:
            self.warmup_factor = num_updates / float(warmup)
            lr = self.warmup_factor * self.lr
        elif num_updates >= total:
            lr = end
        else:
            pct_remaining = 1 - (num_updates - warmup) / (total - warmup)
            lr = (self.lr - end) * pct_remaining ** self.cfg.power + end
        self.set_lr(lr)
        return self.get_lr()
