"""``Run``: everything one training run holds, built once, in a fixed order.

Its own module because building a run (dtypes, the 1-rank group a backend needs, the backend, the save-dir
lock, the task, criterion and model, the fit check, the precision, the trainer, metrics and the stopping
aids) is one job and driving it (``loop.py``: epochs, validation, saves, stopping rules) another; the
driver holds a ``Run`` and never builds a part itself.
"""
import logging
from typing import Dict, Optional

import torch

from shardtrain.data.batch_windows import BatchWindows, parse_windows
from shardtrain.trainer import build
from shardtrain.trainer.launch.one_rank_group import OneRankGroup
from shardtrain.trainer.parallel.choose import build_backend, chosen_backend_class
from shardtrain.trainer.checkpoint.contents import header, stateful_parts
from shardtrain.trainer.checkpoint.manager import CheckpointManager
from shardtrain.core.host_oom import host_memory_for
from shardtrain.trainer.launch.preemption import PreemptionWatcher
from shardtrain.trainer.metrics.progress import build_progress_bar
from shardtrain.trainer.metrics.tensorboard import TensorboardWriter
from shardtrain.trainer.checkpoint.resume import restore
from shardtrain.trainer.memory.fit import check_run_fits
from shardtrain.trainer.metrics.flops import Utilisation, model_flops_per_token, peak_tflops, remeasure
from shardtrain.trainer.metrics.run_metrics import RunMetrics
from shardtrain.trainer.parallel.base import unwrap
from shardtrain.trainer.resolved import Components, build_criterion, build_model, build_task
from shardtrain.trainer.run_facts import RunFacts, refuse_a_cpu_step_it_cannot_follow, run_facts
from shardtrain.trainer.spike import SpikeGuard
from shardtrain.trainer.train_state import TrainingClock
from shardtrain.trainer.trainer import Trainer

logger = logging.getLogger(__name__)
DEFAULT_MAX_TOKENS = 4096  # batch size when neither --max-tokens nor --batch-size is given


class Run:
    """Everything one training run holds; ``loop.py``'s functions drive it."""

    def __init__(self, cfg, ctx):
        self.cfg = cfg  # --threads is applied by launch, for every launcher
        torch.manual_seed(cfg.common.seed)
        components = Components.of(cfg)  # the one look-up of the components' names
        # decided once: the backend, the fit check, the precision and the trainer read them
        self.facts = facts = run_facts(cfg, components, ctx.world_size, ctx.ranks_per_node,
                                       backend=chosen_backend_class(cfg, ctx))
        refuse_a_cpu_step_it_cannot_follow(facts, ctx.device.type)  # before anything is started or written
        # One process has no group from the launcher; a backend that needs one anyway (FSDP2's mesh) gets it here.
        self.group = OneRankGroup(ctx.device) if facts.backend.needs_process_group else None
        try:
            self.backend = build_backend(cfg, ctx, facts.dtypes, facts.backend)
        except BaseException:
            self._close_group()
            raise
        self.checkpoints = CheckpointManager(cfg.checkpoint, is_master=self.backend.is_master,
                                             sharded=self.backend.sharded_checkpoints)
        try:
            self.checkpoints.check_writable()
            self.checkpoints.lock_save_dir()  # before the model is built: a second run is refused at once
            self._build(cfg, ctx, facts, components)
        except BaseException:
            self.checkpoints.close()  # a run that failed to start leaves no save dir behind
            self.backend.close()
            self._close_group()  # nor a process group
            raise

    def _build(self, cfg, ctx, facts: RunFacts, components: Components) -> None:
        self.task = build_task(cfg, components)
        criterion = build_criterion(cfg, components, self.task)
        if not cfg.dataset.disable_validation:
            build.check_best_checkpoint_metric(cfg.checkpoint.best_checkpoint_metric, self.task, criterion)
        check_run_fits(cfg, components, self.task, self.backend, facts)  # before anything is allocated
        with host_memory_for("building the model"):  # a paragraph naming the size, not the allocator's traceback
            precision, model = build.precision_and_model(cfg, self.backend, facts,
                                                         lambda: build_model(cfg, components, self.task),
                                                         compile_blocks=cfg.distributed.compile)
        self.trainer = Trainer(cfg, components, self.task, model, criterion, self.backend, precision, facts)
        self.metrics = RunMetrics(ctx.device, self.trainer, utilisation=self._utilisation(cfg, model, facts.dtypes))
        logger.info(f"rank {ctx.rank} holds {self.metrics.state_memory()} (parameters, gradients, optimizer state) "
                    f"with --ddp-backend {cfg.distributed.ddp_backend}")
        tb_dir = cfg.common.tensorboard_logdir
        self.tensorboard = TensorboardWriter(tb_dir) if tb_dir and self.backend.is_master else None
        self.spikes = SpikeGuard(cfg.optimization) if cfg.optimization.spike_rollback else None
        self.skip_batches = BatchWindows(parse_windows(cfg.dataset.skip_batches))
        self.clock = TrainingClock()  # also the time of the runs it resumes (restored by resume)
        # One process announces Ctrl-C itself; spawned ranks' launcher does, and passes each press on (torchrun's
        # says nothing).
        self.preemption = PreemptionWatcher(announce=self.backend.world_size == 1, led=ctx.spawned)
        self.stopped_by_signal = False  # before the end of training, by Ctrl-C/SIGTERM/SIGUSR1

    def _utilisation(self, cfg, model, dtypes) -> Utilisation:
        """Only the master's records are printed: only it measures a peak (a fraction of a second)."""
        per_token = model_flops_per_token(unwrap(model), self.task.max_positions() or 1)
        peak, again = None, None
        if self.backend.is_master:
            dtype = dtypes.compute or torch.float32
            peak = peak_tflops(self.backend.device, dtype, cfg.common.peak_tflops)
            again = remeasure(self.backend.device, dtype, cfg.common.peak_tflops)
        return Utilisation(per_token, self.backend.world_size, peak, again)

    def batch_iterator(self, split: str, epoch: int, shuffle: bool, valid: bool = False):
        d = self.cfg.dataset
        max_tokens = d.max_tokens
        if max_tokens is None and d.batch_size is None:
            max_tokens = max(DEFAULT_MAX_TOKENS, self.task.max_positions() or 0)
        return self.task.get_batch_iterator(
            split, max_tokens=(d.max_tokens_valid or max_tokens) if valid else max_tokens,
            max_sentences=(d.batch_size_valid or d.batch_size) if valid else d.batch_size,
            required_batch_size_multiple=d.required_batch_size_multiple, seed=self.cfg.common.seed,
            num_shards=self.backend.world_size, shard_id=self.backend.rank, epoch=epoch, shuffle=shuffle)

    def train_iterator(self, epoch: int):
        """Epoch ``epoch``'s iterator over --train-subset."""
        return self.batch_iterator(self.cfg.dataset.train_subset, epoch=epoch, shuffle=True)

    def checkpoint_parts(self, epoch_itr=None) -> Dict:
        """What a checkpoint of this run holds (contents.py); ``epoch_itr``: the one trained on, None to load."""
        return stateful_parts(self.trainer, seed=self.cfg.common.seed, clock=self.clock, meters=self.metrics,
                              make_epoch=self.train_iterator, epoch_itr=epoch_itr, spikes=self.spikes)

    def resume(self):
        """Load the restore checkpoint if there is one (resume.py); return the epoch iterator to train on."""
        epoch_itr = restore(self.cfg, self.checkpoints, self.trainer, self.checkpoint_parts())
        if self.tensorboard is not None and self.trainer.num_updates > 0:
            self.tensorboard.resume_after(self.trainer.num_updates)
        return epoch_itr

    def checkpoint_header(self) -> Dict:
        return header(self.cfg, self.task.fingerprint())

    def progress(self, iterator, epoch: Optional[int], prefix: Optional[str]):
        common = self.cfg.common
        fmt = "none" if not self.backend.is_master else ("simple" if common.no_progress_bar else common.log_format)
        return build_progress_bar(iterator, log_format=fmt, log_interval=common.log_interval, epoch=epoch,
                                  prefix=prefix, tensorboard=self.tensorboard)

    def training_seconds(self) -> float:
        return self.clock.seconds()

    def close(self) -> None:
        self.checkpoints.close()  # a background save must land before the process exits
        self.trainer.close()
        self.preemption.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.backend.close()
        self._close_group()

    def _close_group(self) -> None:
        if self.group is not None:
            self.group.close()
