"""The training driver: epochs, validation, checkpoints and stopping rules.

fairseq_cli/train.py in shape: ``main`` builds everything, then runs epochs;
``validate_and_save`` decides, after every update, whether to validate and
which checkpoints to write.
"""
import itertools
import logging
import os
import time
from typing import Dict, List, Optional, Tuple

import torch
from omegaconf import OmegaConf

from shardtrain.config.epoch_lists import for_epoch
from shardtrain.config.summary import config_summary
from shardtrain.core.errors import CheckpointError
from shardtrain.core.fileio import atomic_write_bytes
from shardtrain.data.batch_windows import BatchWindows, format_batches, parse_windows
from shardtrain.trainer import build
from shardtrain.trainer.parallel.backends import build_backend
from shardtrain.trainer.parallel.prepare import prepare_model
from shardtrain.trainer.metrics.logging_setup import setup_logging
from shardtrain.trainer.checkpoint.contents import header, stateful_parts
from shardtrain.trainer.checkpoint.finite import check_finite
from shardtrain.trainer.checkpoint.manager import CheckpointManager
from shardtrain.trainer.metrics.meters import MetricsLogger
from shardtrain.trainer.precision import build_precision, run_dtypes
from shardtrain.core.host_oom import host_memory_for
from shardtrain.trainer.launch.preemption import PreemptionWatcher, requeue_after_warning
from shardtrain.trainer.metrics.progress import TensorboardWriter, build_progress_bar
from shardtrain.trainer.checkpoint.resume import restore
from shardtrain.trainer.memory_fit import check_run_fits
from shardtrain.trainer.metrics.flops import Utilisation, model_flops_per_token, peak_tflops
from shardtrain.trainer.metrics.run_metrics import RunMetrics, log_throughput
from shardtrain.trainer.parallel.backend import unwrap
from shardtrain.trainer.spike import SpikeGuard
from shardtrain.trainer.train_state import TrainingClock
from shardtrain.trainer.trainer import Trainer

logger = logging.getLogger(__name__)
DEFAULT_MAX_TOKENS = 4096  # batch size when neither --max-tokens nor --batch-size is given
CONFIG_FILE = "config.yaml"  # the resolved config, next to the checkpoints


class Run:
    """Everything one training run holds; the functions below drive it."""

    def __init__(self, cfg, ctx):
        self.cfg = cfg  # --threads is applied by launch, for every launcher
        torch.manual_seed(cfg.common.seed)
        dtypes = run_dtypes(cfg)  # decided once: the backend and the precision receive them
        self.backend = build_backend(cfg, ctx, dtypes)
        self.checkpoints = CheckpointManager(cfg.checkpoint, is_master=self.backend.is_master,
                                             sharded=self.backend.sharded_checkpoints)
        try:
            self.checkpoints.check_writable()
            self.checkpoints.lock_save_dir()  # before the model is built: a second run is refused at once
            self._build(cfg, ctx, dtypes)
        except BaseException:
            self.checkpoints.close()  # a run that failed to start leaves no save dir behind
            self.backend.close()  # nor a process group
            raise

    def _build(self, cfg, ctx, dtypes) -> None:
        self.task = build.build_task(cfg)
        criterion = build.build_criterion(cfg, self.task)
        if not cfg.dataset.disable_validation:
            build.check_best_checkpoint_metric(cfg.checkpoint.best_checkpoint_metric, self.task, criterion)
        check_run_fits(cfg, self.task, self.backend, dtypes)  # before anything is allocated
        precision = build_precision(cfg, self.backend, dtypes)
        d = cfg.distributed
        checkpointing = d.checkpoint_activations or d.offload_activations  # fairseq: offloading implies it
        with host_memory_for("building the model"):  # a paragraph naming the size, not the allocator's traceback
            model = prepare_model(lambda: build.build_model(cfg, self.task), self.backend, seed=cfg.common.seed,
                                  param_dtype=precision.param_dtype, offload_activations=d.offload_activations,
                                  compile_blocks=d.compile, checkpoint_activations_every=(
                                      d.checkpoint_activations_every if checkpointing else None))
        self.trainer = Trainer(cfg, self.task, model, criterion, self.backend, precision)
        self.metrics = RunMetrics(ctx.device, self.trainer, utilisation=self._utilisation(cfg, model, dtypes))
        logger.info(f"rank {ctx.rank} holds {self.metrics.state_memory()} (parameters, gradients, optimizer state) "
                    f"with --ddp-backend {cfg.distributed.ddp_backend}")
        tb_dir = cfg.common.tensorboard_logdir
        self.tensorboard = TensorboardWriter(tb_dir) if tb_dir and self.backend.is_master else None
        self.spikes = SpikeGuard(cfg.optimization) if cfg.optimization.spike_rollback else None
        self.skip_batches = BatchWindows(parse_windows(cfg.dataset.skip_batches))
        self.clock = TrainingClock()  # also the time of the runs it resumes (restored by resume)
        self.preemption = PreemptionWatcher()
        self.stopped_by_signal = False  # before the end of training, by SIGTERM/SIGUSR1

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

    def progress(self, iterator, epoch: Optional[int], prefix: Optional[str]):
        common = self.cfg.common
        fmt = "none" if not self.backend.is_master else ("simple" if common.no_progress_bar else common.log_format)
        return build_progress_bar(iterator, log_format=fmt, log_interval=common.log_interval, epoch=epoch,
                                  prefix=prefix, tensorboard=self.tensorboard)

    def training_seconds(self) -> float:
        return self.clock.seconds()

    def close(self) -> None:
        self.checkpoints.close()  # a background save must land before the process exits
        self.preemption.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        self.backend.close()


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
        requeue_after_warning(run.preemption.received)
    return valid_loss


def train(run: Run) -> Optional[float]:
    """Resume (if there is a checkpoint), then run epochs until a stopping rule fires."""
    cfg = run.cfg
    if not cfg.dataset.disable_validation:
        for subset in cfg.dataset.valid_subset.split(","):
            run.task.dataset(subset)  # a missing or empty split fails now, not after the first epoch
    epoch_itr = restore(run)
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
        epoch_itr = run.batch_iterator(cfg.dataset.train_subset, epoch_itr.next_epoch_idx, shuffle=True)
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
    out = run.trainer.train_step(samples)
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
    run.metrics.epoch.reset()
    return valid_loss, should_stop


def validate_and_save(run: Run, epoch_itr, end_of_epoch: bool) -> Tuple[Optional[float], bool]:
    cfg, state = run.cfg, run.trainer.state
    updates, epoch = state.num_updates, epoch_itr.epoch
    ck, ds, opt = cfg.checkpoint, cfg.dataset, cfg.optimization
    should_stop = False
    if opt.max_update > 0 and updates >= opt.max_update:
        should_stop = True
        logger.info(f"stopping training: num_updates {updates} >= --max-update {opt.max_update}")
    time_up = opt.stop_time_hours > 0 and run.training_seconds() > opt.stop_time_hours * 3600
    if run.preemption.agreed(run.backend, also=time_up):  # every rank stops at the same update
        should_stop = True
        reason = f"--stop-time-hours {opt.stop_time_hours} elapsed" if time_up else "SIGTERM/SIGUSR1 received"
        run.stopped_by_signal = not time_up and not (opt.max_update > 0 and updates >= opt.max_update)
        logger.info(f"stopping training at update {updates}: {reason}; saving checkpoint_last")
    # update 0 (an epoch whose every batch was skipped) is no multiple of an interval, as in fairseq
    on_interval = ck.save_interval_updates > 0 and updates > 0 and updates % ck.save_interval_updates == 0
    on_valid_interval = ds.validate_interval_updates > 0 and updates > 0 and updates % ds.validate_interval_updates == 0
    do_save = ((end_of_epoch and epoch % ck.save_interval == 0) or should_stop
               or (on_interval and updates >= ds.validate_after_updates))
    do_validate = (((not end_of_epoch and do_save) or (end_of_epoch and epoch % ds.validate_interval == 0)
                    or should_stop or on_valid_interval)
                   and not ds.disable_validation and updates >= ds.validate_after_updates)
    valid_loss = validate(run, epoch_itr.epoch)[0] if do_validate else None
    is_best = valid_loss is not None and _is_better(valid_loss, state.best, ck.maximize_best_checkpoint_metric)
    if valid_loss is not None:
        state.num_bad_validations = 0 if is_best else state.num_bad_validations + 1
        state.best = valid_loss if is_best else state.best
        if _out_of_patience(ck.patience, state):
            should_stop = do_save = True  # as fairseq: the updates since the last save are kept
    if end_of_epoch:  # before the save, so a resumed run continues from the stepped schedule
        run.trainer.lr_step(epoch, valid_loss)
    if do_save and not ck.no_save:
        start = time.time()
        names = run.checkpoints.names_for(epoch, updates, end_of_epoch, is_best, valid_loss)
        check_finite(run.trainer.model, run.trainer.optimizer, run.backend, updates)  # on every rank
        paths = run.checkpoints.save(header(run), stateful_parts(run, epoch_itr), epoch, updates, names)
        if names:  # saved (a failed save raised), and named alike on every rank
            run.trainer.precision.checked_save = f"{names[0]} of update {updates}"
        if paths and run.backend.is_master:
            write_config(cfg, ck.save_dir)
        logger.info(f"saved checkpoint {paths[0] if paths else '-'} (epoch {epoch} @ {updates} updates, "
                    f"score {valid_loss}) (writing took {time.time() - start:.2f} seconds)")
    return valid_loss, should_stop


def _out_of_patience(patience: int, state) -> bool:
    """--patience N: after a validation, whether the last N did not improve on the best."""
    if patience <= 0 or state.num_bad_validations < patience:
        return False
    logger.info(f"early stop since valid performance hasn't improved for last {patience} runs")
    return True


def validate(run: Run, epoch: int) -> List[Optional[float]]:
    """Validate on every --valid-subset; returns the best-checkpoint metric of each."""
    seed = run.cfg.dataset.fixed_validation_seed
    if seed is None:
        return _validate_subsets(run, epoch)
    with _forked_rng(run.backend.device):  # training's random state is not this validation's
        torch.manual_seed(seed)
        return _validate_subsets(run, epoch)


def _forked_rng(device: torch.device):
    """torch.manual_seed re-seeds every GPU's generator besides the CPU's, and fork_rng puts back only
    the CPU's and those of the devices it is given: give it the rank's own (training's dropout draws
    there). Other GPUs are not read: that would open a context on each. A --cpu run gives none."""
    if device.type == "cpu":
        return torch.random.fork_rng(devices=[])
    return torch.random.fork_rng(devices=[device], device_type=device.type)


def _validate_subsets(run: Run, epoch: int) -> List[Optional[float]]:
    results = []
    for subset in run.cfg.dataset.valid_subset.split(","):
        itr = run.batch_iterator(subset, epoch=1, shuffle=False, valid=True).next_epoch_itr(shuffle=False)
        progress = run.progress(itr, epoch, prefix=f"valid on '{subset}' subset")
        metrics = MetricsLogger()
        run.metrics.begin_valid()
        since = time.perf_counter()
        for sample in itertools.islice(progress, run.cfg.dataset.max_valid_steps):
            logs = run.trainer.valid_step(sample)
            run.trainer.criterion.reduce_metrics(logs, metrics)
            log_throughput(metrics, logs, since)  # valid_wps, valid_wpb, valid_bsz
        stats = run.metrics.stats(metrics, run.trainer.num_updates, "valid")
        metric = stats.get(run.cfg.checkpoint.best_checkpoint_metric)
        best = run.trainer.state.best
        if metric is not None:
            maximize = run.cfg.checkpoint.maximize_best_checkpoint_metric
            best = metric if _is_better(metric, best, maximize) else best
            stats[f"best_{run.cfg.checkpoint.best_checkpoint_metric}"] = best
        progress.print(stats, tag=subset, step=run.trainer.num_updates)
        progress.close()
        results.append(metric)
    return results


def write_config(cfg, save_dir: str) -> None:
    """The resolved config as ``config.yaml`` in the save dir (``build.from_dict``
    of the loaded YAML rebuilds it). Written after a checkpoint rather than at
    start-up, so a run that fails to start leaves no files; rewritten only when
    it changed (a resumed run with other flags), so it describes the latest run."""
    path = os.path.join(save_dir, CONFIG_FILE)
    text = OmegaConf.to_yaml(cfg).encode("utf-8")
    try:
        if os.path.exists(path):
            with open(path, "rb") as f:
                if f.read() == text:
                    return
        atomic_write_bytes(path, text)
    except OSError as e:
        raise CheckpointError(f"Writing {path} failed: {e.strerror or e}. The checkpoint itself was saved; free "
                              "space in --save-dir (or choose another one) and relaunch the same command.") from None


def _is_better(value: float, best: Optional[float], maximize: bool) -> bool:
    return best is None or (value > best if maximize else value < best)
