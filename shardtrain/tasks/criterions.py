"""Criterions: ``cross_entropy`` and ``label_smoothed_cross_entropy``.

A criterion returns the *summed* loss (nats) with the sample size that
normalises it; the trainer backpropagates the summed loss (fp16 gradients keep
their range) and then divides the gradients by the total sample size across
accumulation steps and ranks, so every rank and ``--update-freq`` computes the
same update as one big batch. Losses are reported in base 2, as fairseq does.
"""
import dataclasses
import math
from typing import Dict, List, Optional, Set

import torch
import torch.nn.functional as F

from shardtrain.core.fields import field
from shardtrain.models.capabilities import forward_inputs
from shardtrain.tasks.registry import register_criterion

LN2 = math.log(2)


class Criterion:
    def __init__(self, cfg, task, sentence_avg: bool = False):
        self.cfg = cfg
        self.padding_idx = task.source_dictionary.pad()
        self.sentence_avg = sentence_avg

    def __call__(self, model, sample):
        """-> (summed loss tensor, sample_size, logging_output of detached tensors/ints)."""
        logits = model(**forward_inputs(model, sample["net_input"]))
        loss, extra = self.compute_loss(logits, sample["target"])
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {"loss": loss.detach(), "ntokens": sample["ntokens"],
                          "nsentences": sample["target"].size(0), "sample_size": sample_size, **extra}
        return loss, sample_size, logging_output

    def compute_loss(self, logits, target):
        raise NotImplementedError

    #: True when compute_loss returns an ``nll_loss`` beside the loss (reduce_metrics logs it then)
    returns_nll_loss = False

    def logged_metrics(self) -> Optional[Set[str]]:
        """The names ``reduce_metrics`` logs (what --best-checkpoint-metric may name), or None
        when not known: a subclass with its own ``reduce_metrics`` and no ``logged_metrics``."""
        if type(self).reduce_metrics is not Criterion.reduce_metrics:
            return None
        nll = self.returns_nll_loss or self.sentence_avg  # the branches of reduce_metrics below
        return {"loss", "ppl", "nll_loss"} if nll else {"loss", "ppl"}

    @staticmethod
    def reduce_metrics(logging_outputs: List[Dict], metrics) -> None:
        """Log base-2 loss (per sample_size) and ppl into a MetricsLogger."""
        total = _sum(logging_outputs)
        sample_size, ntokens = total["sample_size"], total["ntokens"]
        metrics.log_scalar("loss", total["loss"] / max(sample_size, 1) / LN2, sample_size, round=3)
        if "nll_loss" in total:
            metrics.log_scalar("nll_loss", total["nll_loss"] / max(ntokens, 1) / LN2, ntokens, round=3)
            metrics.log_derived("ppl", lambda v: _ppl(v["nll_loss"]), round=2)
        elif sample_size != ntokens:
            metrics.log_scalar("nll_loss", total["loss"] / max(ntokens, 1) / LN2, ntokens, round=3)
            metrics.log_derived("ppl", lambda v: _ppl(v["nll_loss"]), round=2)
        else:
            metrics.log_derived("ppl", lambda v: _ppl(v["loss"]), round=2)


def _ppl(loss_base2: float) -> float:
    try:
        return 2 ** loss_base2
    except OverflowError:
        return float("inf")


def _sum(logging_outputs: List[Dict]) -> Dict[str, float]:
    keys = {k for log in logging_outputs for k in log}
    return {k: float(sum(log.get(k, 0) for log in logging_outputs)) for k in keys}


@dataclasses.dataclass
class CrossEntropyConfig:
    pass


@register_criterion("cross_entropy", dataclass=CrossEntropyConfig)
class CrossEntropyCriterion(Criterion):
    def compute_loss(self, logits, target):
        # float(): low-precision logits are upcast for a stable log-softmax.
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1),
                               ignore_index=self.padding_idx, reduction="sum")
        return loss, {}


@dataclasses.dataclass
class LabelSmoothedCrossEntropyConfig:
    label_smoothing: float = field(0.0, help="epsilon for label smoothing, 0 means no label smoothing")
    ignore_prefix_size: int = field(0, help="ignore the first N target tokens of every sample")


@register_criterion("label_smoothed_cross_entropy", dataclass=LabelSmoothedCrossEntropyConfig)
class LabelSmoothedCrossEntropyCriterion(Criterion):
    """fairseq's formula: eps_i = eps / (V - 1); loss = (1 - eps - eps_i) * nll + eps_i * smooth."""

    returns_nll_loss = True

    def compute_loss(self, logits, target):
        if self.cfg.ignore_prefix_size > 0:
            logits = logits[:, self.cfg.ignore_prefix_size:]
            target = target[:, self.cfg.ignore_prefix_size:]
        lprobs = torch.log_softmax(logits.float(), dim=-1).view(-1, logits.size(-1))
        target = target.reshape(-1, 1)
        pad_mask = target.eq(self.padding_idx)
        nll = -lprobs.gather(dim=-1, index=target).masked_fill(pad_mask, 0.0).sum()
        smooth = -lprobs.sum(dim=-1, keepdim=True).masked_fill(pad_mask, 0.0).sum()
        eps = self.cfg.label_smoothing
        eps_i = eps / (lprobs.size(-1) - 1)
        loss = (1.0 - eps - eps_i) * nll + eps_i * smooth
        return loss, {"nll_loss": nll.detach()}


@dataclasses.dataclass
class AdaptiveLossConfig:
    pass


@register_criterion("adaptive_loss", dataclass=AdaptiveLossConfig)
class AdaptiveLossCriterion(Criterion):
    """fairseq's ``adaptive_loss``: the sum over the adaptive softmax's head and tail
    clusters of their summed cross entropies (pad targets, which sit in the head,
    ignored). Needs a model built with ``--adaptive-softmax-cutoff``.

    One deliberate difference: fairseq passes ``ignore_index=pad`` to the tail
    clusters too, where targets are offsets inside a band, so the word at offset
    ``pad`` of every tail band (e.g. id 20001 under wiki103's cutoffs) never
    counts in its loss; here only the head ignores pad, so the loss is exactly the
    cross entropy of the model's log-probabilities."""

    def __call__(self, model, sample):
        target = sample["target"]
        inputs = forward_inputs(model, sample["net_input"])
        (head, *tails), (head_target, *tail_targets) = model(**inputs, target=target)
        loss = F.cross_entropy(head.float(), head_target, ignore_index=self.padding_idx, reduction="sum")
        for part, part_target in zip(tails, tail_targets):
            loss = loss + F.cross_entropy(part.float(), part_target, reduction="sum")
        sample_size = target.size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {"loss": loss.detach(), "ntokens": sample["ntokens"],
                          "nsentences": target.size(0), "sample_size": sample_size}
        return loss, sample_size, logging_output
