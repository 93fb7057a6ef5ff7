"""Criterions against hand-computed losses (tiny vocabularies, explicit sums)."""
import math
import types

import pytest
import torch

from shardtrain.tasks.criterions import CrossEntropyCriterion, LabelSmoothedCrossEntropyCriterion
from shardtrain.tasks.criterions import CrossEntropyConfig, LabelSmoothedCrossEntropyConfig
from shardtrain.trainer.metrics.meters import MetricsLogger

PAD = 1


class FixedLogits(torch.nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, src_tokens):
        return self.logits


def fake_task():
    return types.SimpleNamespace(source_dictionary=types.SimpleNamespace(pad=lambda: PAD))


def sample(target):
    target = torch.tensor(target)
    return {"net_input": {"src_tokens": target}, "target": target, "ntokens": int((target != PAD).sum())}


def test_cross_entropy_sums_nats_over_non_pad_tokens_and_reports_base_2():
    logits = torch.tensor([[[0.0, 0.0, 1.0, 2.0], [1.0, 1.0, 1.0, 1.0], [3.0, 0.0, 0.0, 0.0]]])
    s = sample([[3, 2, PAD]])
    crit = CrossEntropyCriterion(CrossEntropyConfig(), fake_task())
    loss, sample_size, log = crit(FixedLogits(logits), s)
    lse0 = math.log(2 * math.exp(0) + math.exp(1) + math.exp(2))
    expected = (lse0 - 2.0) + math.log(4.0)  # -log p(3) at step 0, -log 1/4 at step 1, pad ignored
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert sample_size == 2 and log["ntokens"] == 2 and log["nsentences"] == 1
    metrics = MetricsLogger()
    crit.reduce_metrics([log], metrics)
    values = metrics.smoothed_values()
    assert values["loss"] == pytest.approx(expected / 2 / math.log(2), abs=1e-3)
    assert values["ppl"] == pytest.approx(2 ** values["loss"], rel=1e-2)


def test_sentence_avg_normalises_by_sentences():
    s = sample([[3, 2], [2, PAD]])
    crit = CrossEntropyCriterion(CrossEntropyConfig(), fake_task(), sentence_avg=True)
    _, sample_size, log = crit(FixedLogits(torch.zeros(2, 2, 4)), s)
    assert sample_size == 2 and log["ntokens"] == 3
    metrics = MetricsLogger()
    crit.reduce_metrics([log], metrics)
    values = metrics.smoothed_values()
    assert values["loss"] == pytest.approx(3 * 2 / 2, abs=1e-3)  # 3 tokens x log2(4) / 2 sentences
    assert values["nll_loss"] == pytest.approx(2.0, abs=1e-3)


def test_label_smoothing_matches_fairseqs_formula():
    logits = torch.tensor([[[0.5, -1.0, 2.0, 0.0], [0.1, 0.2, 0.3, 0.4]]])
    s = sample([[2, 0]])
    eps = 0.1
    crit = LabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyConfig(label_smoothing=eps), fake_task())
    loss, _, log = crit(FixedLogits(logits), s)
    lprobs = torch.log_softmax(logits[0].double(), -1)
    nll = -(lprobs[0, 2] + lprobs[1, 0])
    smooth = -lprobs.sum()
    eps_i = eps / 3
    expected = (1 - eps - eps_i) * nll + eps_i * smooth
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    assert float(log["nll_loss"]) == pytest.approx(float(nll), rel=1e-6)
    plain, _, _ = CrossEntropyCriterion(CrossEntropyConfig(), fake_task())(FixedLogits(logits), s)
    zero = LabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyConfig(label_smoothing=0.0), fake_task())
    assert float(zero(FixedLogits(logits), s)[0]) == pytest.approx(float(plain), rel=1e-6)
