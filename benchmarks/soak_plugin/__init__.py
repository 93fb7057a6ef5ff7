"""A --user-dir plugin for benchmarks/soak_selfheal.py: language modeling with poisoned batches.

A batch holding a sample whose id is a multiple of --poison-every has every target set to <unk>
(which the data never holds as a target), so the loss and gradient norm of its update spike. The
poison follows the data, not the clock: a run that is killed and resumed meets the same poisons at
the same batches, and a reference run skipping the rolled-back windows never meets them.
"""
import dataclasses

import torch

from shardtrain.core.fields import field
from shardtrain.tasks import register_task
from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask


@dataclasses.dataclass
class PoisonedConfig(LanguageModelingConfig):
    poison_every: int = field(0, help="poison each batch holding a sample id divisible by this (0: none)")


@register_task("lm_poisoned", dataclass=PoisonedConfig)
class PoisonedTask(LanguageModelingTask):
    def collater(self, samples):
        batch = super().collater(samples)
        every = self.cfg.poison_every
        if every and batch and any(int(i) % every == 0 for i in batch["id"]):
            batch["target"] = torch.full_like(batch["target"], self.dictionary.unk())
        return batch
