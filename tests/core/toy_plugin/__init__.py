"""A --user-dir plugin: registers a task, a model and an architecture."""
import dataclasses

import torch
from torch import nn

from shardtrain.core.fields import field
from shardtrain.models import register_model, register_model_architecture
from shardtrain.tasks import register_task
from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

BUILT = {}  # the test reads what the plugin's components were built with


@dataclasses.dataclass
class ToyTaskConfig(LanguageModelingConfig):
    toy_greeting: str = field("hello", help="a task flag that only exists with --task toy_lm")


@register_task("toy_lm", dataclass=ToyTaskConfig)
class ToyTask(LanguageModelingTask):
    def __init__(self, cfg):
        super().__init__(cfg)
        BUILT["greeting"] = cfg.toy_greeting


@dataclasses.dataclass
class ToyModelConfig:
    toy_dim: int = field(16, help="embedding size")
    toy_layers: int = field(1, help="number of residual MLP blocks")


class ToyBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


@register_model("toy_bigram", dataclass=ToyModelConfig)
class ToyBigram(nn.Module):
    def __init__(self, cfg, vocab_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, cfg.toy_dim)
        self.blocks = nn.ModuleList(ToyBlock(cfg.toy_dim) for _ in range(cfg.toy_layers))
        self.out = nn.Linear(cfg.toy_dim, vocab_size)

    @classmethod
    def build_model(cls, cfg, task):
        BUILT["dim"], BUILT["layers"] = cfg.toy_dim, cfg.toy_layers
        return cls(cfg, len(task.dictionary))

    def forward(self, src_tokens):
        x = self.embed(src_tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


@register_model_architecture("toy_bigram", "toy_bigram_wide")
def toy_bigram_wide():
    return {"toy_dim": 48, "toy_layers": 2}
