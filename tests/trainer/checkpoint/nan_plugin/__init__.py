"""A --user-dir plugin for the fault tests: ``cross_entropy`` whose loss turns NaN
at a chosen update on a chosen rank, as a bad batch or an overflow would."""
import dataclasses

import torch.distributed as dist

from shardtrain.core.fields import field
from shardtrain.tasks import register_criterion
from shardtrain.tasks.criterions import CrossEntropyCriterion


@dataclasses.dataclass
class NanCrossEntropyConfig:
    nan_at_update: int = field(3, help="the training step (counted from 1 in this process) whose loss is NaN")
    nan_rank: int = field(0, help="the rank whose loss is NaN; the others stay finite")
    nan_updates: int = field(1, help="how many training steps in a row, from --nan-at-update, are NaN")


@register_criterion("nan_cross_entropy", dataclass=NanCrossEntropyConfig)
class NanCrossEntropyCriterion(CrossEntropyCriterion):
    def __init__(self, cfg, task, sentence_avg=False):
        super().__init__(cfg, task, sentence_avg)
        self.training_calls = 0  # one call per step (update or skipped) with --update-freq 1

    def __call__(self, model, sample):
        loss, sample_size, log = super().__call__(model, sample)
        if model.training:
            self.training_calls += 1
            rank = dist.get_rank() if dist.is_initialized() else 0
            first = self.cfg.nan_at_update
            if first <= self.training_calls < first + self.cfg.nan_updates and rank == self.cfg.nan_rank:
                # A product, not a sum, so the gradient is NaN too (d(loss + nan) is finite).
                loss = loss * float("nan")
        return loss, sample_size, log
