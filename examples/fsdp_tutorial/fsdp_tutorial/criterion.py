"""Criterion ``image_cross_entropy``: cross entropy over classes, with accuracy.

Like fairseq's ``sentence_prediction``: the summed loss over the batch with
the number of images as sample size, logged in base 2, and ``accuracy`` (the
percentage of images whose top-scoring class is the label) in every train and
validation record.
"""
import dataclasses
import math
from typing import Dict, List

import torch.nn.functional as F

from shardtrain.core.errors import ConfigError
from shardtrain.tasks import register_criterion

LN2 = math.log(2)


@dataclasses.dataclass
class ImageCrossEntropyConfig:
    pass


@register_criterion("image_cross_entropy", dataclass=ImageCrossEntropyConfig)
class ImageCrossEntropyCriterion:
    def __init__(self, cfg, task, sentence_avg: bool = False):
        if not hasattr(task, "num_classes"):
            raise ConfigError("--criterion image_cross_entropy classifies images: use it with --task "
                              "image_classification (language models take --criterion cross_entropy).")
        self.cfg = cfg
        self.sentence_avg = sentence_avg  # the trainer reads it; images are the unit either way

    def __call__(self, model, sample):
        """-> (summed loss, sample size, logging output), as every shardtrain criterion."""
        logits = model(**sample["net_input"])
        target = sample["target"]
        # float(): low-precision logits are upcast for a stable log-softmax.
        loss = F.cross_entropy(logits.float(), target, reduction="sum")
        ncorrect = (logits.argmax(dim=-1) == target).sum()
        n = target.numel()
        logging_output = {"loss": loss.detach(), "ncorrect": ncorrect.detach(), "ntokens": n, "nsentences": n,
                          "sample_size": n}
        return loss, n, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs: List[Dict], metrics) -> None:
        total = {k: float(sum(log.get(k, 0) for log in logging_outputs))
                 for k in ("loss", "ncorrect", "nsentences", "sample_size")}
        sample_size, nsentences = total["sample_size"], total["nsentences"]
        metrics.log_scalar("loss", total["loss"] / max(sample_size, 1) / LN2, sample_size, round=3)
        metrics.log_scalar("accuracy", 100.0 * total["ncorrect"] / max(nsentences, 1), nsentences, round=1)
