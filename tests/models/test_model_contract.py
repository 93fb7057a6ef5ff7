"""The model contract: a criterion calls ``model(**sample["net_input"])``, so a task may give a model more
than ``src_tokens``; ``src_lengths``, which fairseq's models take and most ignore, may go untaken; anything
else a model does not take is refused rather than silently dropped."""
import pytest
import torch
from torch import nn

from shardtrain.core.errors import ConfigError
from shardtrain.models.capabilities import forward_inputs
from shardtrain.tasks.criterions import CrossEntropyConfig, CrossEntropyCriterion

TOKENS = torch.tensor([[5, 6, 7]])
NET_INPUT = {"src_tokens": TOKENS, "src_lengths": torch.tensor([3])}


class TokensOnly(nn.Module):  # a model written for the old contract, forward(src_tokens)
    def forward(self, src_tokens):
        return src_tokens


class WithPositions(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = None

    def forward(self, src_tokens, positions=None, cache=None):
        self.seen = positions
        return torch.nn.functional.one_hot(src_tokens, 10).float()


class TakesAnything(nn.Module):
    def forward(self, src_tokens, **extra):
        return extra


class Wrapper(nn.Module):  # as DDP and torch.compile wrap a model: forward(*args, **kwargs) to .module/_orig_mod
    def __init__(self, inner, attr="module"):
        super().__init__()
        setattr(self, attr, inner)

    def forward(self, *args, **kwargs):
        return next(self.children())(*args, **kwargs)


def test_src_lengths_goes_untaken_by_a_model_that_does_not_take_it():
    assert list(forward_inputs(TokensOnly(), NET_INPUT)) == ["src_tokens"]


def test_an_input_the_model_takes_reaches_it_and_one_it_does_not_is_refused_by_name():
    positions = torch.tensor([[0, 1, 2]])
    assert set(forward_inputs(WithPositions(), {**NET_INPUT, "positions": positions})) == {"src_tokens", "positions"}
    with pytest.raises(ConfigError) as e:
        forward_inputs(TokensOnly(), {**NET_INPUT, "doc_mask": torch.ones(1, 3, dtype=torch.bool)})
    assert "gives the model doc_mask, which TokensOnly.forward does not take (it takes src_tokens)" in str(e.value)


def test_a_model_taking_any_keywords_gets_everything():
    assert set(forward_inputs(TakesAnything(), {**NET_INPUT, "doc_mask": 1})) == {"src_tokens", "src_lengths",
                                                                                  "doc_mask"}


@pytest.mark.parametrize("attr", ["module", "_orig_mod"])
def test_a_wrapped_model_is_asked_what_the_model_inside_takes(attr):
    with pytest.raises(ConfigError, match="doc_mask, which TokensOnly.forward"):
        forward_inputs(Wrapper(TokensOnly(), attr), {**NET_INPUT, "doc_mask": 1})
    assert list(forward_inputs(Wrapper(TokensOnly(), attr), NET_INPUT)) == ["src_tokens"]


class _Dictionary:
    def pad(self):
        return 1


class _Task:
    source_dictionary = _Dictionary()


def test_the_criterion_gives_the_model_the_tasks_whole_net_input():
    model, positions = WithPositions(), torch.tensor([[4, 0, 1]])
    sample = {"net_input": {**NET_INPUT, "positions": positions}, "target": torch.tensor([[6, 7, 2]]), "ntokens": 3}
    criterion = CrossEntropyCriterion(CrossEntropyConfig(), _Task())
    loss, sample_size, _ = criterion(model, sample)
    assert model.seen is positions and sample_size == 3
    # one-hot logits of the input tokens: each target scored under a uniform-but-one distribution, by hand
    log_z = torch.log(torch.tensor(torch.e + 9.0))
    assert loss.item() == pytest.approx(float(3 * log_z), rel=1e-6)  # no target equals its input token
