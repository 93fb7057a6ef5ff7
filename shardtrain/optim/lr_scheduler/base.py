"""The learning-rate scheduler interface, as fairseq's trainer drives it.

The trainer calls, in this order::

    scheduler = cls(cfg, optimizer, lr, max_update)   # lr for update 0 is now set
    for epoch in 1, 2, ...:                            # epochs count from 1, as in fairseq
        scheduler.step_begin_epoch(epoch)
        for each update:
            optimizer.step(); num_updates += 1
            scheduler.step_update(num_updates)
        scheduler.step(epoch, val_loss)                # end of epoch

``lr`` is fairseq's ``--lr``: the peak learning rate of every built-in schedule;
a sequence of several (one per epoch) only for schedules with ``takes_lr_list``.
Every call sets the new lr on all optimizer param groups and returns it.
``state_dict()`` holds everything a resumed run needs to continue the same
schedule, including the lr currently on the optimizer.
"""
from typing import Any, Dict, Optional, Tuple

import torch

from shardtrain.config.epoch_lists import numbers
from shardtrain.core.errors import ConfigError


class LRScheduler:
    # Attributes that change during training; state_dict() saves exactly these.
    # Subclasses extend the tuple. "best" is the lowest validation loss seen,
    # the state a reduce-on-plateau-like schedule needs.
    state_attrs: Tuple[str, ...] = ("best", "lr_scale")
    # A schedule driven by the validation metric sets this; it is then built with
    # maximize=--maximize-best-checkpoint-metric, the metric's direction.
    follows_validation = False
    # fairseq's `fixed` takes one --lr per epoch; every other schedule refuses a list.
    takes_lr_list = False

    def __init__(self, cfg: Any, optimizer: torch.optim.Optimizer, lr: float, max_update: int):
        self.cfg = cfg
        self.optimizer = optimizer
        self.lrs = tuple(float(v) for v in numbers(lr))
        name = type(self).__name__
        require(len(self.lrs) == 1 or self.takes_lr_list,
                f"--lr {','.join(f'{v:g}' for v in self.lrs)} gives one lr per epoch, which only --lr-scheduler fixed "
                f"uses ({name} needs a single --lr). Pass one --lr, or --lr-scheduler fixed.")
        self.peak_lr = self.lrs[0]
        self.max_update = int(max_update or 0)
        self.best: Optional[float] = None
        self.lr_scale = 1.0  # --spike-lr-scale ** rollbacks: every lr the schedule sets is multiplied by it

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr * self.lr_scale

    def set_lr_scale(self, scale: float) -> None:
        """From now on every lr is ``scale`` x the schedule's; the current one too (a schedule that
        leaves the lr alone between its steps, as reduce_lr_on_plateau after warmup, keeps it)."""
        for group in self.optimizer.param_groups:
            group["lr"] = group["lr"] * (scale / self.lr_scale)
        self.lr_scale = scale

    def get_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def step_begin_epoch(self, epoch: int) -> float:
        """Update the lr at the beginning of ``epoch`` (counted from 1)."""
        return self.get_lr()

    def step(self, epoch: int, val_loss: Optional[float] = None) -> float:
        """Update the lr at the end of ``epoch``, given its validation loss if any."""
        if val_loss is not None:
            self.best = val_loss if self.best is None else min(self.best, val_loss)
        return self.get_lr()

    def step_update(self, num_updates: int) -> float:
        """Update the lr after ``num_updates`` updates in total."""
        return self.get_lr()

    def state_dict(self) -> Dict[str, Any]:
        state = {name: getattr(self, name) for name in self.state_attrs}
        state["optimizer_lr"] = self.get_lr()
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values. Missing keys keep their current value,
        so the smaller states fairseq checkpoints hold (``{"best": ...}``) load too."""
        for name in self.state_attrs:
            if name in state_dict:
                setattr(self, name, state_dict[name])
        if "optimizer_lr" in state_dict:  # the lr as set, lr_scale included
            for group in self.optimizer.param_groups:
                group["lr"] = state_dict["optimizer_lr"]


def require(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` (what is wrong and the fix) unless ``condition``."""
    if not condition:
        raise ConfigError(message)


def check_warmup_updates(name: str, warmup_updates: int) -> None:
    require(warmup_updates >= 0,
            f"--warmup-updates is {warmup_updates} for --lr-scheduler {name}; it must be >= 0 "
            "(0 disables warmup).")
