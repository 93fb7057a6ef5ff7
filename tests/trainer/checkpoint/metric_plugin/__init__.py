"""A --user-dir plugin criterion that logs an extra validation metric (``accuracy``) and, like
plugins written before criterions declared their metrics, does not say so (no logged_metrics)."""
import dataclasses

from shardtrain.tasks import register_criterion
from shardtrain.tasks.criterions import CrossEntropyCriterion


@dataclasses.dataclass
class AccuracyCrossEntropyConfig:
    pass


@register_criterion("accuracy_cross_entropy", dataclass=AccuracyCrossEntropyConfig)
class AccuracyCrossEntropyCriterion(CrossEntropyCriterion):
    def reduce_metrics(self, logging_outputs, metrics):
        super().reduce_metrics(logging_outputs, metrics)
        metrics.log_scalar("accuracy", 0.5, 1, round=3)  # a stand-in: only its presence matters here
