"""The criterion flags, given on shard-train's command line, change the loss by fairseq's formulas.

Flags parsed by ``parse_train_args``, the criterion built by the trainer's ``build_criterion``; the
losses are worked out by hand below. The dictionary holds only the 4 special symbols (bos 0, pad 1,
eos 2, unk 3), so the model's logits have 4 entries per token.
"""
import math

import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.data.dictionary import Dictionary
from shardtrain.tasks.language_modeling import LanguageModelingTask
from shardtrain.trainer.metrics.meters import MetricsLogger
from shardtrain.trainer.resolved import Components, build_criterion

UNIFORM = [0.0, 0.0, 0.0, 0.0]  # every token p = 1/4
FAVOURS_2 = [0.0, 0.0, math.log(2), 0.0]  # p = (1/5, 1/5, 2/5, 1/5)


class FixedLogits(torch.nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = torch.tensor(logits)

    def forward(self, src_tokens):
        return self.logits


def criterion(*flags):
    cfg = parse_train_args(["data-bin", *flags])
    return build_criterion(cfg, Components.of(cfg), LanguageModelingTask(cfg.task, dictionary=Dictionary()))


def loss_of(crit, logits, target):
    target = torch.tensor(target)
    sample = {"net_input": {"src_tokens": target}, "target": target, "ntokens": int((target != 1).sum())}
    return crit(FixedLogits(logits), sample)


@pytest.mark.flag_effect("--label-smoothing")
def test_label_smoothing_mixes_in_the_uniform_distribution():
    crit = criterion("--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.3")
    loss, _, log = loss_of(crit, [[FAVOURS_2]], [[2]])
    # eps 0.3, eps_i = 0.3 / 3 = 0.1; nll = -log(2/5) = log 2.5; smooth = -sum log p = 3 log 5 + log 2.5
    # loss = (1 - 0.3 - 0.1) * nll + 0.1 * smooth = 0.7 log 2.5 + 0.3 log 5
    assert float(loss) == pytest.approx(0.7 * math.log(2.5) + 0.3 * math.log(5), rel=1e-6)
    assert float(log["nll_loss"]) == pytest.approx(math.log(2.5), rel=1e-6)
    plain, _, _ = loss_of(criterion("--criterion", "label_smoothed_cross_entropy"), [[FAVOURS_2]], [[2]])
    assert float(plain) == pytest.approx(math.log(2.5), rel=1e-6)  # the default 0: the plain nll


@pytest.mark.flag_effect("--ignore-prefix-size")
def test_ignore_prefix_size_drops_the_first_targets():
    crit = criterion("--criterion", "label_smoothed_cross_entropy", "--ignore-prefix-size", "1")
    loss, _, _ = loss_of(crit, [[UNIFORM, FAVOURS_2]], [[3, 2]])
    assert float(loss) == pytest.approx(math.log(2.5), rel=1e-6)  # only the second token: -log(2/5)
    whole, _, _ = loss_of(criterion("--criterion", "label_smoothed_cross_entropy"), [[UNIFORM, FAVOURS_2]], [[3, 2]])
    assert float(whole) == pytest.approx(math.log(4) + math.log(2.5), rel=1e-6)


@pytest.mark.flag_effect("--sentence-avg")
def test_sentence_avg_normalises_by_sentences_not_tokens():
    logits, target = [[UNIFORM, UNIFORM], [UNIFORM, UNIFORM]], [[3, 2], [2, 1]]  # 3 tokens, 2 sentences
    for flags, sample_size in (((), 3), (("--sentence-avg",), 2)):
        crit = criterion(*flags)
        loss, size, log = loss_of(crit, logits, target)
        assert size == sample_size and log["ntokens"] == 3
        assert float(loss) == pytest.approx(3 * math.log(4), rel=1e-6)
        metrics = MetricsLogger()
        crit.reduce_metrics([log], metrics)
        # loss in bits per sample_size unit: 3 tokens x 2 bits / sample_size
        assert metrics.smoothed_values()["loss"] == pytest.approx(6 / sample_size, abs=1e-3)
