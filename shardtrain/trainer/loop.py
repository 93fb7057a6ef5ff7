"""The training driver: epochs, validation, checkpoints and stopping rules.

fairseq_cli/train.py in shape: ``main`` builds everything, then runs epochs;
after every update ``validate_and_save`` takes its steps in order: whether to
stop, whether validation and a save are due (validation.py), validating, the
epoch's lr step, saving.
"""
import itertools
import logging
import os
import time
from typing import Dict, Optional, Tuple

import torch

from shardtrain.config.epoch_lists import for_epoch
from shardtrain.config.summary import config_summary
from shardtrain.data.batch_windows import BatchWindows, format_batches, parse_windows
from shardtrain.trainer import build
from shardtrain.trainer.launch.one_rank_group import OneRankGroup
from shardtrain.trainer.parallel.choose import build_backend, chosen_backend_class
from shardtrain.trainer.parallel.prepare import prepare_run_model
from shardtrain.trainer.metrics.logging_setup import setup_logging
from shardtrain.trainer.checkpoint.contents import header, stateful_parts
from shardtrain.trainer.checkpoint.finite import check_finite
from shardtrain.trainer.checkpoint.manager import CONFIG_FILE, CheckpointManager, write_config
from shardtrain.trainer.precision import TrainingDivergedError, build_precision, run_dtypes
from shardtrain.core.host_oom import host_memory_for
from shardtrain.trainer.launch.preemption import PreemptionWatcher, requeue_after_warning, stopped_message
from shardtrain.trainer.metrics.progress import TensorboardWriter, build_progress_bar
from shardtrain.trainer.checkpoint.resume import restore
from shardtrain.trainer.memory.fit import check_run_fits
from shardtrain.trainer.metrics.flops import Utilisation, model_flops_per_token, peak_tflops
from shardtrain.trainer.metrics.run_metrics import RunMetrics
from shardtrain.trainer.parallel.base import unwrap
from shardtrain.trainer.resolved import Components, build_criterion, build_model, build_task
from shardtrain.trainer.spike import SpikeGuard
from shardtrain.trainer.train_state import TrainingClock
from shardtrain.trainer.validation import Due, Interrupted, due, record, validate
from shardtrain.trainer.trainer import Trainer

logger = logging.getLogger(__name__)
DEFAULT_MAX_TOKENS = 4096  # batch size when neither --max-tokens nor --batch-size is given


class Run:
    """Everything one training run holds; the functions below drive it."""

    def __init__(self, cfg, ctx):
        self.cfg = cfg  # --threads is applied by launch, for every launcher
        torch.manual_seed(cfg.common.seed)
        dtypes = run_dtypes(cfg)  # decided once: the backend and the precision receive them
        # One process has no group from the launcher; a backend that needs one anyway (FSDP2's mesh) gets it here.
        self.group = OneRankGroup(ctx.device) if chosen_backend_class(cfg, ctx).needs_process_group else None
        try:
            self.backend = build_backend(cfg, ctx, dtypes)
        except BaseException:
            self._close_group()
            raise
        self.checkpoints = CheckpointManager(cfg.checkpoint, is_master=self.backend.is_master,
                                             sharded=self.backend.sharded_checkpoints)
        try:
            self.checkpoints.check_writable()
            self.checkpoints.lock_save_dir()  # before the model is built: a second run is refused at once
            self._build(cfg, ctx, dtypes, Components.of(cfg))  # the one look-up of the components' names
        except BaseException:
            self.checkpoints.close()  # a run that failed to start leaves no save dir behind
            self.backend.close()
            self._close_group()  # nor a process group
            raise

    def _build(self, cfg, ctx, dtypes, components: Components) -> None:
        self.task = build_task(cfg, components)
        criterion = build_criterion(cfg, components, self.task)
        if not cfg.dataset.disable_validation:
            build.check_best_checkpoint_metric(cfg.checkpoint.best_checkpoint_metric, self.task, criterion)
        check_run_fits(cfg, components, self.task, self.backend, dtypes)  # before anything is allocated
        precision = build_precision(cfg, self.backend, dtypes)
        with host_memory_for("building the model"):  # a paragraph naming the size, not the allocator's traceback
            model = prepare_run_model(cfg, lambda: build_model(cfg, components, self.task), self.backend,
                                      precision.param_dtype, compile_blocks=cfg.distributed.compile)
        self.trainer = Trainer(cfg, components, self.task, model, criterion, self.backend, precision)
        self.metrics = RunMetrics(ctx.device, self.trainer, utilisation=self._utilisation(cfg, model, dtypes))
        logger.info(f"rank {ctx.rank} holds {self.metrics.state_memory()} (parameters, gradients, optimizer state) "
                    f"with --ddp-backend {cfg.distributed.ddp_backend}")
        tb_dir = cfg.common.tensorboard_logdir
        self.tensorboard = TensorboardWriter(tb_dir) if tb_dir and self.backend.is_master else None
        self.spikes = SpikeGuard(cfg.optimization) if cfg.optimization.spike_rollback else None
        self.skip_batches = BatchWindows(parse_windows(cfg.dataset.skip_batches))
        self.clock = TrainingClock()  # also the time of the runs it resumes (restored by resume)
        # One process announces Ctrl-C itself; spawned ranks' launcher does (torchrun's says nothing).
        self.preemption = PreemptionWatcher(announce=self.backend.world_size == 1)
        self.stopped_by_signal = False  # before the end of training, by Ctrl-C/SIGTERM/SIGUSR1

    def _utilisation(self, cfg, model, dtypes) -> Utilisation:
        """Only the master's records are printed: only it measures a peak (a fraction of a second)."""
        per_token = model_flops_per_token(unwrap(model), self.task.max_positions() or 1)
        peak = None
        if self.backend.is_master:
            peak = peak_tflops(self.backend.device, dtypes.compute or torch.float32, cfg.common.peak_tflops)
        return Utilisation(per_token, self.backend.world_size, peak)

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


def main(cfg, ctx) -> Optional[float]:
    """Train until a stopping rule fires; return the last validation loss. Runs on every rank."""
    setup_logging(cfg.common.log_file, ctx.rank)
    logger.info("config:\n" + config_summary(cfg, os.path.join(cfg.checkpoint.save_dir, CONFIG_FILE)))
    start = time.time()
    run = Run(cfg, ctx)
    try:
        valid_loss = train(run)
        logger.info(f"done training in {time.time() - start:.1f} seconds")
    finally:
        run.close()  # a background save lands before a requeue below
    if run.stopped_by_signal and ctx.is_master:
        ck = cfg.checkpoint
        logger.info(stopped_message(run.preemption.interrupted, run.trainer.num_updates, ck.no_save, ck.save_dir))
        requeue_after_warning(run.preemption.received)
    return valid_loss



def train(run: Run) -> Optional[float]:
    """Resume (if there is a checkpoint), then run epochs until a stopping rule fires."""
    cfg = run.cfg
    if not cfg.dataset.disable_validation:
        for subset in cfg.dataset.valid_subset.split(","):
            run.task.dataset(subset)  # a missing or empty split fails now, not after the first epoch
    epoch_itr = run.resume()
    max_update = cfg.optimization.max_update
    if max_update > 0 and run.trainer.num_updates >= max_update:
        # fairseq trains (and saves) one more update here, changing a finished model
        logger.info(f"nothing to train: the checkpoint is at update {run.trainer.num_updates} and --max-update is "
                    f"{max_update} (raise --max-update to train on)")
        return None
    if cfg.checkpoint.patience > 0 and run.trainer.state.num_bad_validations >= cfg.checkpoint.patience:
        # the checkpoint is where --patience stopped: one more update would change a finished model
        logger.info(f"nothing to train: the checkpoint's last {run.trainer.state.num_bad_validations} validations "
                    f"did not improve on the best, and --patience is {cfg.checkpoint.patience} (raise it to train on)")
        return None
    max_epoch = cfg.optimization.max_epoch or float("inf")
    valid_loss, lr = None, run.trainer.get_lr()
    while epoch_itr.next_epoch_idx <= max_epoch:
        valid_loss, should_stop = train_epoch(run, epoch_itr)
        if should_stop:
            break
        lr, previous = run.trainer.get_lr(), lr  # validate_and_save stepped the scheduler at the epoch's end
        # "falls to": fairseq also stops on a low lr while it is still rising in warmup
        # (with --stop-min-lr 0 and warmup from 0, before the first update).
        if lr <= cfg.optimization.stop_min_lr and lr < previous:
            logger.info(f"stopping training: the learning rate {lr:.3g} fell to --stop-min-lr "
                        f"{cfg.optimization.stop_min_lr:g}")
            break
        epoch_itr = run.train_iterator(epoch_itr.next_epoch_idx)
    for warning in run.skip_batches.end_run(run.trainer.num_updates):
        logger.warning(warning)
    return valid_loss


def train_or_skip(run: Run, samples, epoch: int, position: int) -> Optional[Dict]:
    """One update on ``samples``, the batches up to ``position`` of ``epoch``; None when it is skipped
    (--skip-batches) or rolled back (--spike-rollback)."""
    first = position - len(samples) + 1
    skipped = run.skip_batches.skip(epoch, first, position)
    if skipped:  # only the batches named: an update keeps the rest of its --update-freq batches
        logger.info(f"skipped batches {format_batches(skipped)} of epoch {epoch} (--skip-batches)")
        samples = [sample for batch, sample in enumerate(samples, first) if batch not in skipped]
        if not samples:
            return None
    run.metrics.begin_update()
    try:
        out = run.trainer.train_step(samples)
    except TrainingDivergedError as e:  # only the checkpoint code knows which checkpoint is intact
        raise e.naming(run.checkpoints.last_checked_save) from None
    run.metrics.end_update()
    if run.spikes is not None:
        if run.spikes.after_update(run.trainer, out, epoch, position):
            return None  # the update is undone and its batches skipped
        out.update(run.spikes.metrics())
    return out


def train_epoch(run: Run, epoch_itr) -> Tuple[Optional[float], bool]:
    cfg, trainer = run.cfg, run.trainer
    itr = epoch_itr.next_epoch_itr(shuffle=True)
    trainer.set_dummy_batch(epoch_itr.first_batch)
    update_freq = for_epoch(cfg.optimization.update_freq, epoch_itr.epoch)  # fairseq's per-epoch list
    progress = run.progress(itr, epoch_itr.epoch, prefix=None)
    trainer.lr_step_begin_epoch(epoch_itr.epoch)
    logger.info(f"begin training epoch {epoch_itr.epoch}")
    valid_loss, should_stop = None, False
    if run.spikes is not None:  # the state to roll back to until the first interval's snapshot
        run.spikes.begin_epoch(trainer, epoch_itr.epoch, itr.n)
    run.skip_batches.begin_epoch(epoch_itr.epoch, itr.n)
    if itr.n == 0:
        # An epoch's record covers that epoch only: a checkpoint saved at the previous epoch's end holds
        # that epoch's meters. Mid-epoch (itr.n > 0) the restored meters are kept, as fairseq restores
        # them, so the record of a resumed epoch covers the whole epoch, its updates before the resume too.
        run.metrics.epoch.reset()
    batches = iter(progress)
    for samples in iter(lambda: list(itertools.islice(batches, update_freq)), []):
        out = train_or_skip(run, samples, epoch_itr.epoch, itr.n)
        end_of_epoch = not itr.has_next()
        if out is None or not out["stepped"]:  # skipped on every rank (fp16 overflow, NaN, rolled back,
            # --skip-batches): nothing new to log or save
            if end_of_epoch:
                valid_loss, should_stop = validate_and_save(run, epoch_itr, end_of_epoch)
            continue
        run.metrics.log_update(trainer.criterion, out, trainer.num_updates)
        if progress.due(trainer.num_updates):
            stats = run.metrics.stats(run.metrics.inner, trainer.num_updates, "train_inner")
            progress.log(stats, "train_inner", trainer.num_updates)
            run.metrics.inner.reset()
        valid_loss, should_stop = validate_and_save(run, epoch_itr, end_of_epoch)
        if should_stop:
            break
    for warning in run.skip_batches.end_epoch(epoch_itr.epoch, len(itr)) if not itr.has_next() else []:
        logger.warning(warning)
    progress.print(run.metrics.stats(run.metrics.epoch, trainer.num_updates, "train"), "train", trainer.num_updates)
    progress.close()
    return valid_loss, should_stop


def validate_and_save(run: Run, epoch_itr, end_of_epoch: bool) -> Tuple[Optional[float], bool]:
    """After an update (or an epoch's end with none): whether to stop, validate and save, then do so;
    returns the validation loss (None when none ran) and whether training stops."""
    ck, state, epoch = run.cfg.checkpoint, run.trainer.state, epoch_itr.epoch
    should_stop = stop_requested(run, state.num_updates)
    when = due(state.num_updates, epoch, end_of_epoch, should_stop, ck, run.cfg.dataset)
    try:
        valid_loss = validate(run, epoch)[0] if when.validate else None
    except Interrupted:  # by a signal, part-way: nothing recorded, save checkpoint_last and stop
        valid_loss, when = None, Due(validate=False, save=True)
        should_stop = should_stop or stop_requested(run, state.num_updates)
    is_best, out_of_patience = record(valid_loss, state, ck)
    do_save = when.save
    if out_of_patience:
        should_stop = do_save = True  # as fairseq: the updates since the last save are kept
    if end_of_epoch:  # before the save, so a resumed run continues from the stepped schedule
        run.trainer.lr_step(epoch, valid_loss)
    if do_save and not ck.no_save:
        save(run, epoch_itr, end_of_epoch, is_best, valid_loss)
    return valid_loss, should_stop


def stop_requested(run: Run, updates: int) -> bool:
    """Whether training stops after update ``updates``: --max-update, --stop-time-hours or a signal
    (the last two agreed on by every rank, so that every rank stops at the same update)."""
    opt = run.cfg.optimization
    should_stop = False
    if opt.max_update > 0 and updates >= opt.max_update:
        should_stop = True
        logger.info(f"stopping training: num_updates {updates} >= --max-update {opt.max_update}")
    time_up = opt.stop_time_hours > 0 and run.training_seconds() > opt.stop_time_hours * 3600
    if run.preemption.agreed(run.backend, also=time_up):  # every rank stops at the same update
        should_stop = True
        signalled = "Ctrl-C (SIGINT)" if run.preemption.interrupted else "SIGTERM/SIGUSR1"
        reason = f"--stop-time-hours {opt.stop_time_hours} elapsed" if time_up else f"{signalled} received"
        run.stopped_by_signal = not time_up and not (opt.max_update > 0 and updates >= opt.max_update)
        logger.info(f"stopping training at update {updates}: {reason}; saving checkpoint_last")
    return should_stop


def save(run: Run, epoch_itr, end_of_epoch: bool, is_best: bool, valid_loss: Optional[float]) -> None:
    """This update's checkpoints (named by the --save-* and --keep-* flags), checked finite first."""
    start, updates, epoch = time.time(), run.trainer.num_updates, epoch_itr.epoch
    names = run.checkpoints.names_for(epoch, updates, end_of_epoch, is_best, valid_loss)
    check_finite(run.trainer.model, run.trainer.optimizer, run.backend, updates)  # on every rank
    paths = run.checkpoints.save(run.checkpoint_header(), run.checkpoint_parts(epoch_itr), epoch, updates, names)
    if paths and run.backend.is_master:
        write_config(run.cfg, run.cfg.checkpoint.save_dir)
    logger.info(f"saved checkpoint {paths[0] if paths else '-'} (epoch {epoch} @ {updates} updates, "
                f"score {valid_loss}) (writing took {time.time() - start:.2f} seconds)")
