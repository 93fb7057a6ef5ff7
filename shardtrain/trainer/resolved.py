"""A config's components, looked up once, and the task, model and criterion built from them.

``Components.of(cfg)`` is the one place a run turns --task, --arch, --criterion, --optimizer and
--lr-scheduler into their registered classes; every builder receives the result instead of looking
a name up again. Training (``trainer.build``) and loading for inference (``checkpoint.inference``)
both build their task and model here, so inference needs nothing of the training build or precision.
"""
import dataclasses
from typing import Callable

from shardtrain.config.components import resolve


@dataclasses.dataclass(frozen=True)
class Components:
    """The registered class (or builder) of each component slot."""

    task: type
    model: type
    criterion: type
    optimizer: Callable
    lr_scheduler: type

    @classmethod
    def of(cls, cfg) -> "Components":
        slots = resolve(cfg.components)
        return cls(task=slots["task"].obj, model=slots["model"].obj, criterion=slots["criterion"].obj,
                   optimizer=slots["optimizer"].obj, lr_scheduler=slots["lr_scheduler"].obj)


def build_task(cfg, components: Components):
    return components.task.setup_task(cfg.task)


def build_model(cfg, components: Components, task):
    return task.build_model(components.model, cfg.model)


def build_criterion(cfg, components: Components, task):
    return task.build_criterion(components.criterion, cfg.criterion, sentence_avg=cfg.optimization.sentence_avg)
