"""A --user-dir plugin for tests/trainer/launch/test_peer_lost.py: language modeling whose rank
--exit-rank leaves with os._exit(3) when it collates its --exit-at-batch-th batch (a crash in native
code ends a rank so, without a Python exception). The rank is the launcher's (SLURM_PROCID or RANK)."""
import dataclasses
import os

from shardtrain.core.fields import field
from shardtrain.tasks import register_task
from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

RANK = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))


@dataclasses.dataclass
class PeerExitsConfig(LanguageModelingConfig):
    exit_at_batch: int = field(0, help="rank --exit-rank exits collating this batch (0: never)")
    exit_rank: int = field(1, help="the rank --exit-at-batch ends")


@register_task("lm_peer_exits", dataclass=PeerExitsConfig)
class PeerExitsTask(LanguageModelingTask):
    collated = 0

    def collater(self, samples):
        PeerExitsTask.collated += 1
        if PeerExitsTask.collated == self.cfg.exit_at_batch and RANK == self.cfg.exit_rank:
            os._exit(3)
        return super().collater(samples)
