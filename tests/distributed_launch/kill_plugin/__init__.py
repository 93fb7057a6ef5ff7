"""A --user-dir plugin for the restart test: language modeling whose rank 1 SIGKILLs itself when it
collates its --kill-at-batch-th batch, in the first attempt only (torchrun counts its restarts in
TORCHELASTIC_RESTART_COUNT), as a machine failure would end it."""
import dataclasses
import os
import signal

from shardtrain.core.fields import field
from shardtrain.tasks import register_task
from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask


@dataclasses.dataclass
class KilledOnceConfig(LanguageModelingConfig):
    kill_at_batch: int = field(0, help="rank 1 dies when collating this batch in torchrun's first attempt (0: never)")


@register_task("lm_killed_once", dataclass=KilledOnceConfig)
class KilledOnceTask(LanguageModelingTask):
    collated = 0

    def collater(self, samples):
        KilledOnceTask.collated += 1
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if (self.cfg.kill_at_batch and KilledOnceTask.collated == self.cfg.kill_at_batch and first_attempt
                and os.environ.get("RANK") == "1"):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().collater(samples)
