"""``cosine``: linear warmup, then cosine annealing with warm restarts (SGDR), as in fairseq 0.12."""
import dataclasses
import math
from typing import Optional

from shardtrain.core.fields import field
from shardtrain.optim.lr_scheduler.base import LRScheduler, check_warmup_updates, require
from shardtrain.optim.registry import register_lr_scheduler


@dataclasses.dataclass
class CosineLRScheduleConfig:
    warmup_updates: int = field(0, help="warmup the learning rate linearly for the first N updates")
    warmup_init_lr: float = field(-1.0, help="initial learning rate during warmup phase (-1: --min-lr)")
    min_lr: float = field(0.0, help="min learning rate; --lr is the max and must be more than this")
    max_lr: Optional[float] = field(
        None, help="fairseq<=0.10 only; since 0.12 --lr is the max learning rate (setting this is an error)")
    t_mult: float = field(1.0, help="factor to grow the length of each period")
    lr_period_updates: float = field(-1.0, help="initial number of updates per period (-1: --max-update minus "
                                     "--warmup-updates)")
    lr_shrink: float = field(0.1, help="shrink factor for annealing")


@register_lr_scheduler("cosine", dataclass=CosineLRScheduleConfig)
class CosineLRSchedule(LRScheduler):
    """Cosine schedule of https://arxiv.org/abs/1608.03983 with fairseq 0.12's flags.

    ``--lr`` is the max (peak) lr and ``--min-lr`` the floor. In fairseq 0.10
    and earlier ``--max-lr`` was the peak and ``--lr`` the floor; that command
    line is rejected here with the translation. With ``W = warmup_updates`` and
    ``P = lr_period_updates`` (default ``max_update - W``), after update ``n``::

        n < W:   lr_n = warmup_init_lr + n * (lr - warmup_init_lr) / W
        else:    t = n - W;  i = the period t falls in (periods grow by t_mult);
                 t_i = P * t_mult**i;  t_curr = t - (start of period i)
                 lr_n = min_lr * s + 0.5 * (lr - min_lr) * s * (1 + cos(pi * t_curr / t_i)),  s = lr_shrink**i

    ``--warmup-init-lr`` -1 (the default) means ``--min-lr``.
    """

    def __init__(self, cfg, optimizer, lr, max_update):
        super().__init__(cfg, optimizer, lr, max_update)
        require(cfg.max_lr is None,
                f"--max-lr {cfg.max_lr} is how fairseq<=0.10 set the cosine schedule's peak; since fairseq 0.12 "
                "--lr is the peak and --min-lr the floor. Drop --max-lr, pass its value as --lr, and pass your "
                "old --lr as --min-lr.")
        require(self.peak_lr > cfg.min_lr,
                f"--lr {self.peak_lr} (the cosine schedule's max lr) must be more than --min-lr {cfg.min_lr}. "
                "Raise --lr or lower --min-lr.")
        check_warmup_updates("cosine", cfg.warmup_updates)
        require(cfg.t_mult > 0 and cfg.lr_shrink > 0,
                f"--t-mult ({cfg.t_mult}) and --lr-shrink ({cfg.lr_shrink}) must be positive. "
                "The defaults are 1.0 and 0.1.")
        self.warmup_updates = cfg.warmup_updates
        self.min_lr = cfg.min_lr
        self.warmup_init_lr = cfg.warmup_init_lr if cfg.warmup_init_lr >= 0 else cfg.min_lr
        self.period = cfg.lr_period_updates if cfg.lr_period_updates > 0 else self.max_update - self.warmup_updates
        require(self.period > 0,
                "--lr-scheduler cosine needs a period length: set --lr-period-updates N, or --max-update larger "
                f"than --warmup-updates (now --max-update {self.max_update}, --warmup-updates "
                f"{self.warmup_updates}) so the period defaults to the updates after warmup.")
        self.t_mult = cfg.t_mult
        self.lr_step = (self.peak_lr - self.warmup_init_lr) / self.warmup_updates if self.warmup_updates > 0 else 1
        self.step_update(0)

    def _period_position(self, curr_updates: float):
        """(index i of the period, its length t_i, updates t_curr into it)."""
        if self.t_mult != 1:
            i = math.floor(math.log(1 - curr_updates / self.period * (1 - self.t_mult), self.t_mult))
            t_i = self.t_mult ** i * self.period
            t_curr = curr_updates - (1 - self.t_mult ** i) / (1 - self.t_mult) * self.period
        else:
            i = math.floor(curr_updates / self.period)
            t_i = self.period
            t_curr = curr_updates - self.period * i
        return i, t_i, t_curr

    def step_update(self, num_updates: int) -> float:
        if num_updates < self.warmup_updates:
            lr = self.warmup_init_lr + num_updates * self.lr_step
        else:
            i, t_i, t_curr = self._period_position(num_updates - self.warmup_updates)
            shrink = self.cfg.lr_shrink ** i
            min_lr, max_lr = self.min_lr * shrink, self.peak_lr * shrink
            lr = min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * t_curr / t_i))
        self.set_lr(lr)
        return lr
