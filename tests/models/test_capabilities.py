"""A model's optional capabilities: each has its default in models/capabilities.py, documented in
docs/plugins.md, and no other module probes a model for one itself. (The plugin folder a checkpoint
is loaded with: test_plugin_trust.py.)"""
import os
import re

import torch
from torch import nn

import shardtrain
from shardtrain.models import capabilities
from shardtrain.models.beam_search import beam_search
from shardtrain.models.sampling import sample_lines, sample_scored

ROOT = os.path.dirname(os.path.dirname(shardtrain.__file__))


class Bare(nn.Module):
    """forward(src_tokens) only; prefers token 1 (the padding symbol of a shardtrain dictionary), then 5."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(3))
        self.longest = 0  # the longest input seen

    def forward(self, src_tokens):
        self.longest = max(self.longest, src_tokens.shape[-1])
        logits = torch.zeros(*src_tokens.shape, 8)
        logits[..., 1], logits[..., 5] = 9.0, 5.0
        return logits


def test_a_bare_model_gets_the_documented_defaults():
    bare = Bare()
    assert capabilities.max_positions(bare) is None
    assert capabilities.room_after(bare, 1000, 7) == 7  # unbounded
    assert capabilities.flops_per_token(bare, 10) == 18.0  # 6 x 3 parameters
    assert capabilities.padding_idx(bare, 1) == 1 and not capabilities.has_kv_cache(bare)
    assert capabilities.blocks(bare) is None and not capabilities.has_init_weights(bare)
    assert capabilities.repeated_layers_field(Bare) is None
    assert capabilities.output_weight(bare) is None  # its loss takes forward's logits
    bare.max_positions, bare.padding_idx = 4, 2
    bare.flops_per_token = lambda seq_len: 100.0 * seq_len
    assert capabilities.room_after(bare, 3, 7) == 1 and capabilities.padding_idx(bare, 1) == 2
    assert capabilities.flops_per_token(bare, 10) == 1000.0


class Projecting(Bare):
    def output_weight(self):
        return self.weight


class Featured(Projecting):
    def forward(self, src_tokens, features_only=False):
        return super().forward(src_tokens)


class AnyInputs(Projecting):
    def forward(self, src_tokens, **kwargs):
        return super().forward(src_tokens)


def test_output_weight_is_asked_only_of_a_forward_that_takes_features_only():
    assert capabilities.output_weight(Projecting()) is None  # forward(src_tokens) could not return the features
    assert capabilities.output_weight(AnyInputs()) is None  # **kwargs: no telling that it would
    featured = Featured()
    assert capabilities.output_weight(featured) is featured.weight
    featured.output_weight = lambda: None  # a model that has none this time (an adaptive softmax)
    assert capabilities.output_weight(featured) is None


def test_generation_without_max_positions_padding_idx_or_cache():
    prompt = torch.tensor([2, 5, 5])
    new, scores = sample_scored(Bare(), prompt, max_len=4, greedy=True, eos=2, pad=1)
    assert new.tolist() == [5, 5, 5, 5, 2]  # the padding symbol is never chosen; eos forced at the end
    assert len(scores) == 2 + 5
    found = beam_search(Bare(), prompt, beam=2, max_len=3, eos=2, pad=1)
    assert found[0].new_tokens == [5, 5, 5, 2]
    # without a position limit every line sees all the lines before it
    bare = Bare()
    assert sample_lines(bare, torch.tensor([2] * 50), lines=2, eos=2, max_line_len=3, greedy=True, pad=1) == [[5] * 3] * 2
    assert bare.longest == 50 + 4 + 2  # the second line's prompt (the context, line one and its eos) + 2 new tokens


def test_every_capability_is_documented_and_probed_only_in_capabilities():
    with open(os.path.join(ROOT, "docs", "plugins.md")) as f:
        docs = f.read()
    expected = {"max_positions", "flops_per_token", "padding_idx", "new_kv_cache", "init_weights", "blocks",
                "repeated_layers_field", "output_weight"}
    assert set(capabilities.DEFAULTS) == expected
    for name in expected:
        assert re.search(rf"^\| `{name}", docs, re.M), f"docs/plugins.md has no row for {name}"
    probe = re.compile(r"(getattr|hasattr)\([^,()]+, \"(%s)\"" % "|".join(expected))
    package = os.path.join(ROOT, "shardtrain")
    for folder, _, files in os.walk(package):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and path != capabilities.__file__:
                with open(path) as f:
                    found = probe.search(f.read())
                assert found is None, f"{os.path.relpath(path, ROOT)} probes {found.group(0)}: ask capabilities"
