"""``reduce_lr_on_plateau``: shrink the lr when the validation metric stops improving (fairseq 0.12).

fairseq/optim/lr_scheduler/reduce_lr_on_plateau.py wraps torch's
``ReduceLROnPlateau``; so does this. The metric is ``--best-checkpoint-metric``
of the first ``--valid-subset`` (lower is better unless
``--maximize-best-checkpoint-metric``), given to :meth:`step` at the end of
each epoch. Unlike fairseq, the state dict keeps torch's whole plateau state
(also the count of bad epochs), so a resumed run shrinks the lr when the
uninterrupted one would.
"""
import dataclasses
from typing import Optional

import torch

from shardtrain.core.fields import field
from shardtrain.optim.lr_scheduler.base import LRScheduler, check_warmup_updates, require
from shardtrain.optim.registry import register_lr_scheduler


@dataclasses.dataclass
class ReduceLROnPlateauLRScheduleConfig:
    lr_shrink: float = field(0.1, help="shrink factor for annealing")
    lr_threshold: float = field(1e-4, help="threshold for measuring the new optimum, to only focus on significant "
                                "changes")
    lr_patience: int = field(0, help="number of epochs with no improvement after which learning rate will be "
                             "reduced")
    warmup_updates: int = field(0, help="warmup the learning rate linearly for the first N updates")
    warmup_init_lr: float = field(-1.0, help="initial learning rate during warmup phase (-1: --lr without warmup, "
                                  "0 with it)")


@register_lr_scheduler("reduce_lr_on_plateau", dataclass=ReduceLROnPlateauLRScheduleConfig)
class ReduceLROnPlateauLRSchedule(LRScheduler):
    """Optional linear warmup from ``--warmup-init-lr`` to ``--lr`` over ``--warmup-updates``
    (``lr_n = warmup_init_lr + n * (lr - warmup_init_lr) / warmup_updates``), then the lr only
    changes at the end of an epoch: times ``--lr-shrink`` once the metric has not improved by
    more than ``--lr-threshold`` (relative) for more than ``--lr-patience`` epochs."""

    follows_validation = True  # built with maximize= (--maximize-best-checkpoint-metric)
    state_attrs = LRScheduler.state_attrs + ("warmup_end",)

    def __init__(self, cfg, optimizer, lr, max_update, maximize: bool = False):
        super().__init__(cfg, optimizer, lr, max_update)
        check_warmup_updates("reduce_lr_on_plateau", cfg.warmup_updates)
        require(0 < cfg.lr_shrink < 1, f"--lr-shrink is {cfg.lr_shrink} for --lr-scheduler reduce_lr_on_plateau; "
                "it multiplies the lr on a plateau and must be in (0, 1), e.g. 0.1 (the default).")
        require(cfg.lr_patience >= 0, f"--lr-patience is {cfg.lr_patience}; it counts epochs and must be >= 0.")
        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="max" if maximize else "min", factor=cfg.lr_shrink, patience=cfg.lr_patience,
            threshold=cfg.lr_threshold)
        self.warmup_updates = cfg.warmup_updates
        if cfg.warmup_init_lr >= 0:
            self.warmup_init_lr = cfg.warmup_init_lr
        else:
            self.warmup_init_lr = 0.0 if self.warmup_updates > 0 else self.peak_lr
        self.warmup_end = self.warmup_updates == 0
        self.set_lr(self.peak_lr if self.warmup_end else self.warmup_init_lr)

    def step(self, epoch: int, val_loss: Optional[float] = None) -> float:
        """The plateau rule sees the metric only once warmup is over (as in fairseq)."""
        if val_loss is not None and self.warmup_end:
            self.plateau.step(val_loss)
        else:
            self.plateau.last_epoch = epoch
        self.best = self.plateau.best if self.plateau.best not in (float("inf"), float("-inf")) else None
        return self.get_lr()

    def step_update(self, num_updates: int) -> float:
        if self.warmup_updates > 0 and num_updates <= self.warmup_updates:
            step = (self.peak_lr - self.warmup_init_lr) / self.warmup_updates
            self.set_lr(self.warmup_init_lr + num_updates * step)
        elif self.warmup_updates > 0:
            self.warmup_end = True
        return self.get_lr()

    def state_dict(self):
        plateau = {name: getattr(self.plateau, name) for name in _PLATEAU_STATE}
        return {**super().state_dict(), "plateau": plateau}

    def load_state_dict(self, state_dict) -> None:
        """Ours, or fairseq's ``{"best", "last_epoch"}``. The flags (shrink, patience, ...) stay this run's."""
        super().load_state_dict(state_dict)
        plateau = state_dict.get("plateau") or {k: v for k, v in state_dict.items() if k in ("last_epoch", "best")}
        for name in _PLATEAU_STATE:
            if plateau.get(name) is not None:
                setattr(self.plateau, name, plateau[name])


# What torch's ReduceLROnPlateau changes as it steps.
_PLATEAU_STATE = ("best", "num_bad_epochs", "last_epoch", "cooldown_counter")
