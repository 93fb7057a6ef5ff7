"""``tri_stage``: warmup, hold, exponential decay (https://arxiv.org/abs/1904.08779), as in fairseq 0.12."""
import dataclasses
import math
from typing import Optional, Tuple

from shardtrain.core.fields import field
from shardtrain.optim.lr_scheduler.base import LRScheduler, require
from shardtrain.optim.optim_config import parse_float_tuple
from shardtrain.optim.registry import register_lr_scheduler


@dataclasses.dataclass
class TriStageLRScheduleConfig:
    warmup_steps: int = field(0, help="warmup the learning rate linearly for the first N updates")
    hold_steps: int = field(0, help="steps in hold stage")
    decay_steps: int = field(0, help="steps in decay stages")
    phase_ratio: Optional[Tuple[float, float, float]] = field(
        None, help="if set, automatically sets warmup/hold/decay steps to the ratio specified here "
        "from max_updates. the ratios must add up to 1.0")
    init_lr_scale: float = field(0.01, help="initial learning rate scale during warmup phase")
    final_lr_scale: float = field(0.01, help="final learning rate scale")


@register_lr_scheduler("tri_stage", dataclass=TriStageLRScheduleConfig)
class TriStageLRSchedule(LRScheduler):
    """With ``W, H, D`` the warmup, hold and decay steps (or ``int(max_update * ratio)``
    for each ``--phase-ratio`` entry), after update ``n``::

        n < W:              lr_n = lr * init_lr_scale + n * lr * (1 - init_lr_scale) / W
        n < W + H:          lr_n = lr
        n <= W + H + D:     lr_n = lr * exp(log(final_lr_scale) * (n - W - H) / D)
        otherwise:          lr_n = lr * final_lr_scale

    ``--lr`` is the peak. With ``D = 0`` the decay stage is the single update
    ``n = W + H`` at the peak (fairseq divides by zero there).
    """

    def __init__(self, cfg, optimizer, lr, max_update):
        super().__init__(cfg, optimizer, lr, max_update)
        self.warmup_steps, self.hold_steps, self.decay_steps = self._stage_lengths(cfg)
        require(min(self.warmup_steps, self.hold_steps, self.decay_steps) >= 0,
                "--warmup-steps, --hold-steps and --decay-steps must be >= 0.")
        require(self.warmup_steps + self.hold_steps + self.decay_steps > 0,
                "--lr-scheduler tri_stage has no steps: set --warmup-steps/--hold-steps/--decay-steps, or "
                "--phase-ratio '(0.1, 0.4, 0.5)' together with --max-update.")
        require(cfg.init_lr_scale > 0 and cfg.final_lr_scale > 0,
                f"--init-lr-scale ({cfg.init_lr_scale}) and --final-lr-scale ({cfg.final_lr_scale}) must be "
                "positive fractions of --lr. The defaults are 0.01.")
        self.init_lr = cfg.init_lr_scale * self.peak_lr
        self.final_lr = cfg.final_lr_scale * self.peak_lr
        self.warmup_rate = (self.peak_lr - self.init_lr) / self.warmup_steps if self.warmup_steps else 0.0
        self.decay_factor = -math.log(cfg.final_lr_scale) / self.decay_steps if self.decay_steps else 0.0
        self.step_update(0)

    def _stage_lengths(self, cfg) -> Tuple[int, int, int]:
        if cfg.phase_ratio is None:
            return cfg.warmup_steps, cfg.hold_steps, cfg.decay_steps
        ratios = parse_float_tuple(cfg.phase_ratio, "--phase-ratio", (0.1, 0.4, 0.5))
        # fairseq compares the sum with == 1, which rejects e.g. (0.1, 0.2, 0.7) to rounding.
        require(math.isclose(sum(ratios), 1.0, abs_tol=1e-6) and min(ratios) >= 0,
                f"--phase-ratio {ratios} must be three non-negative fractions of --max-update that add up to 1 "
                "(warmup, hold, decay), e.g. --phase-ratio '(0.1, 0.4, 0.5)'.")
        require(self.max_update > 0,
                "--phase-ratio gives the stages as fractions of --max-update, which is not set. Pass "
                "--max-update N, or give the stages directly with --warmup-steps/--hold-steps/--decay-steps.")
        return tuple(int(self.max_update * r) for r in ratios)

    def step_update(self, num_updates: int) -> float:
        hold_start = self.warmup_steps
        decay_start = hold_start + self.hold_steps
        if num_updates < hold_start:
            lr = self.init_lr + self.warmup_rate * num_updates
        elif num_updates < decay_start:
            lr = self.peak_lr
        elif num_updates <= decay_start + self.decay_steps:
            lr = self.peak_lr * math.exp(-self.decay_factor * (num_updates - decay_start))
        else:
            lr = self.final_lr
        self.set_lr(lr)
        return lr
