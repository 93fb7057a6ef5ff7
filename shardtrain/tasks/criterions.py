"""Criterions: ``cross_entropy`` and ``label_smoothed_cross_entropy``.

A criterion returns the *summed* loss (nats) with the sample size that
normalises it; the trainer backpropagates the summed loss (fp16 gradients keep
their range) and then divides the gradients by the total sample size across
accumulation steps and ranks, so every rank and ``--update-freq`` computes the
same update as one big batch. Losses are reported in base 2, as fairseq does.
``cross_entropy`` and ``label_smoothed_cross_entropy`` project and score large
batches chunk by chunk (``--loss-chunks``, chunked_loss.py), so that their
logits never exist whole.
"""
import dataclasses
import math
from typing import Dict, List, Optional, Set

import torch
import torch.nn.functional as F

from shardtrain.core.fields import field
from shardtrain.models import capabilities
from shardtrain.models.capabilities import forward_inputs
from shardtrain.tasks.chunked_loss import LOGITS_BUDGET, check_largest_batch, check_requested, chunk_count, chunked_loss
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
        return self.outputs(*self.compute_loss(logits, sample["target"]), sample)

    def outputs(self, loss, extra: Dict, sample):
        """(loss, sample_size, logging_output) of a summed loss and compute_loss's extra logging values."""
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


class ProjectedLoss(Criterion):
    """A loss of the output projection's logits, which projects a batch chunk by chunk when ``--loss-chunks``
    (``cfg.loss_chunks``) says so: 0, the default, where the batch's fp32 logits would exceed
    chunked_loss.LOGITS_BUDGET and the model allows (capabilities.output_weight), else the whole batch."""

    def __init__(self, cfg, task, sentence_avg: bool = False):
        super().__init__(cfg, task, sentence_avg)
        # A plugin's subclass with a config of its own (no loss_chunks) may score logits its own way in
        # compute_loss: it keeps the whole batch's logits, as before --loss-chunks.
        self.loss_chunks = getattr(cfg, "loss_chunks", 1)
        check_requested(self.loss_chunks)

    def __call__(self, model, sample):
        target = self.kept(sample["target"])
        weight = capabilities.output_weight(model)  # before forward only its shape counts (it may be a shard)
        vocab = 0 if weight is None else weight.size(0)
        chunks = chunk_count(self.loss_chunks, target.numel(), vocab, weight is not None)
        if chunks == 1:
            return super().__call__(model, sample)
        features = self.kept(model(**forward_inputs(model, sample["net_input"]), features_only=True))
        loss, nll = chunked_loss(features.reshape(-1, features.size(-1)), capabilities.output_weight(model),
                                 target.reshape(-1), chunks=chunks, ignore_index=self.padding_idx,
                                 label_smoothing=self.smoothing())
        return self.outputs(loss, {"nll_loss": nll.detach()} if self.returns_nll_loss else {}, sample)

    def check_batch_tokens(self, tokens: int) -> None:
        """Refuse a --loss-chunks above the run's largest batch (``tokens``), before the run starts."""
        check_largest_batch(self.loss_chunks, tokens)

    def kept(self, x: torch.Tensor) -> torch.Tensor:
        """The time steps of ``x`` [batch, time, ...] that the loss scores."""
        return x

    def smoothing(self) -> float:
        return 0.0


LOSS_CHUNKS_HELP = ("chunks of the output projection and the loss per batch, so the whole batch's logits never "
                    f"exist: 0 chunks batches whose fp32 logits would exceed {LOGITS_BUDGET // 2 ** 20} MiB, in as "
                    "few chunks as keep each within it; 1 never chunks")


@dataclasses.dataclass
class CrossEntropyConfig:
    loss_chunks: int = field(0, help=LOSS_CHUNKS_HELP)


@register_criterion("cross_entropy", dataclass=CrossEntropyConfig)
class CrossEntropyCriterion(ProjectedLoss):
    def compute_loss(self, logits, target):
        # float(): low-precision logits are upcast for a stable log-softmax.
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1),
                               ignore_index=self.padding_idx, reduction="sum")
        return loss, {}


@dataclasses.dataclass
class LabelSmoothedCrossEntropyConfig:
    label_smoothing: float = field(0.0, help="epsilon for label smoothing, 0 means no label smoothing")
    ignore_prefix_size: int = field(0, help="ignore the first N target tokens of every sample")
    loss_chunks: int = field(0, help=LOSS_CHUNKS_HELP)


@register_criterion("label_smoothed_cross_entropy", dataclass=LabelSmoothedCrossEntropyConfig)
class LabelSmoothedCrossEntropyCriterion(ProjectedLoss):
    """fairseq's formula: eps_i = eps / (V - 1); loss = (1 - eps - eps_i) * nll + eps_i * smooth."""

    returns_nll_loss = True

    def kept(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.ignore_prefix_size > 0:
            return x[:, self.cfg.ignore_prefix_size:]
        return x

    def smoothing(self) -> float:
        return self.cfg.label_smoothing

    def compute_loss(self, logits, target):
        logits, target = self.kept(logits), self.kept(target)
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
