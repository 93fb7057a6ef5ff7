"""A --user-dir plugin with only what docs/plugins.md requires of a model: a config dataclass,
``build_model(cls, cfg, task)`` and ``forward(src_tokens)`` -> logits. No max_positions,
flops_per_token, padding_idx, KV cache, init_weights or blocks: every command must work without them."""
import dataclasses

from torch import nn

from shardtrain.core.fields import field
from shardtrain.models import register_model


@dataclasses.dataclass
class GRULMConfig:
    gru_dim: int = field(32, help="embedding and hidden size of the GRU")


@register_model("gru_lm", dataclass=GRULMConfig)
class GRULM(nn.Module):
    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab_size)

    @classmethod
    def build_model(cls, cfg, task):
        return cls(len(task.source_dictionary), cfg.gru_dim)

    def forward(self, src_tokens):
        hidden, _ = self.gru(self.embed(src_tokens))
        return self.out(hidden)
