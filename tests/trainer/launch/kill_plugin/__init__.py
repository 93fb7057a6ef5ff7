"""A --user-dir plugin for the torchrun restart tests: language modeling whose rank --kill-rank
SIGKILLs itself when it collates its --kill-at-batch-th batch, as a machine failure would end it, or
whose rank 0 sends SIGTERM to torchrun at its --preempt-at-batch-th batch, as a scheduler preempting
the job would. Both in torchrun's first attempt only (it counts restarts in TORCHELASTIC_RESTART_COUNT).
--slow-finalize-s holds every checkpoint's finalizing back that long in the first attempt, so an
--async-save is still in flight when the kill comes."""
import dataclasses
import os
import signal
import time

from shardtrain.core.fields import field
from shardtrain.tasks import register_task
from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
from shardtrain.trainer.checkpoint import sharded_saver

FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
RANK = int(os.environ.get("RANK", "0"))


@dataclasses.dataclass
class KilledOnceConfig(LanguageModelingConfig):
    kill_at_batch: int = field(0, help="rank --kill-rank dies collating this batch in the first attempt (0: never)")
    kill_rank: int = field(1, help="the rank --kill-at-batch kills")
    preempt_at_batch: int = field(0, help="rank 0 sends SIGTERM to torchrun at this batch in the first attempt")
    slow_finalize_s: float = field(0.0, help="in the first attempt, finalize each checkpoint this much later")


@register_task("lm_killed_once", dataclass=KilledOnceConfig)
class KilledOnceTask(LanguageModelingTask):
    collated = 0

    def __init__(self, cfg, *args, **kwargs):
        super().__init__(cfg, *args, **kwargs)
        if cfg.slow_finalize_s and FIRST_ATTEMPT:
            real = sharded_saver.finalize

            def slow_finalize(*a, **k):
                time.sleep(cfg.slow_finalize_s)
                return real(*a, **k)

            sharded_saver.finalize = slow_finalize

    def collater(self, samples):
        KilledOnceTask.collated += 1
        if FIRST_ATTEMPT and KilledOnceTask.collated == self.cfg.kill_at_batch and RANK == self.cfg.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)
        if FIRST_ATTEMPT and KilledOnceTask.collated == self.cfg.preempt_at_batch and RANK == 0:
            os.kill(os.getppid(), signal.SIGTERM)  # torchrun's agent: it passes SIGTERM on to every rank
        return super().collater(samples)


# In the restarted attempt rank 0 reaches the process group late: its peer then reads the store's
# keys before rank 0 rewrote them (the race a loaded machine makes now and then, made certain).
if not FIRST_ATTEMPT and RANK == 0:
    time.sleep(3)
