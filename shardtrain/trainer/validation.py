"""Validation in the training loop: when it is due (and the saves it gates), running it, and
what a result does to the best and to --patience.

``due`` is fairseq_cli/train.py's ``validate_and_save`` decision, a pure function of the update,
the epoch and the flags; loop.py takes the steps in order.
"""
import dataclasses
import itertools
import logging
import time
from typing import List, Optional, Tuple

import torch

from shardtrain.trainer.metrics.meters import MetricsLogger
from shardtrain.trainer.metrics.run_metrics import log_throughput

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Due:
    validate: bool
    save: bool


def due(updates: int, epoch: int, end_of_epoch: bool, stopping: bool, ck, ds) -> Due:
    """Whether to validate and whether to save after update ``updates`` of epoch ``epoch`` (at the
    epoch's end or not), when the run is ``stopping`` there or not; ``ck`` and ``ds`` are the config's
    checkpoint and dataset sections. --patience may add a save once the validation has run."""
    # update 0 (an epoch whose every batch was skipped) is no multiple of an interval, as in fairseq
    on_interval = ck.save_interval_updates > 0 and updates > 0 and updates % ck.save_interval_updates == 0
    on_valid_interval = ds.validate_interval_updates > 0 and updates > 0 and updates % ds.validate_interval_updates == 0
    do_save = ((end_of_epoch and epoch % ck.save_interval == 0) or stopping
               or (on_interval and updates >= ds.validate_after_updates))
    do_validate = (((not end_of_epoch and do_save) or (end_of_epoch and epoch % ds.validate_interval == 0)
                    or stopping or on_valid_interval)
                   and not ds.disable_validation and updates >= ds.validate_after_updates)
    return Due(validate=do_validate, save=do_save)


def record(valid_loss: Optional[float], state, ck) -> Tuple[bool, bool]:
    """Keep the best validation and the count of those since it in ``state`` (the trainer's);
    return whether ``valid_loss`` is a new best, and whether --patience has run out."""
    if valid_loss is None:
        return False, False
    is_best = _is_better(valid_loss, state.best, ck.maximize_best_checkpoint_metric)
    state.num_bad_validations = 0 if is_best else state.num_bad_validations + 1
    state.best = valid_loss if is_best else state.best
    return is_best, _out_of_patience(ck.patience, state)


def _out_of_patience(patience: int, state) -> bool:
    """--patience N: after a validation, whether the last N did not improve on the best."""
    if patience <= 0 or state.num_bad_validations < patience:
        return False
    logger.info(f"early stop since valid performance hasn't improved for last {patience} runs")
    return True


def validate(run, epoch: int) -> List[Optional[float]]:
    """Validate ``run`` (loop.Run) on every --valid-subset; returns the best-checkpoint metric of each."""
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


class Interrupted(Exception):
    """A first Ctrl-C, SIGTERM or SIGUSR1 (agreed by every rank) stopped validation part-way: what it saw is no
    validation, so nothing is recorded from it (no best checkpoint, no --patience count); the run saves and stops."""


def _validate_subsets(run, epoch: int) -> List[Optional[float]]:
    results = []
    for subset in run.cfg.dataset.valid_subset.split(","):
        itr = run.batch_iterator(subset, epoch=1, shuffle=False, valid=True).next_epoch_itr(shuffle=False)
        progress = run.progress(itr, epoch, prefix=f"valid on '{subset}' subset")
        metrics = MetricsLogger()
        run.metrics.begin_valid()
        since = time.perf_counter()
        batches = min(len(itr), run.cfg.dataset.max_valid_steps or len(itr))
        for done, sample in enumerate(itertools.islice(progress, run.cfg.dataset.max_valid_steps)):
            # Before every batch (a tiny all-reduce: the ranks stop at the same one): a long validation would
            # otherwise hold a first Ctrl-C or a preemption's signal for all of its batches.
            if run.preemption.agreed(run.backend):
                progress.close()
                logger.info(f"validation on '{subset}' stopped after {done} of {batches} batches by "
                            f"{'Ctrl-C' if run.preemption.interrupted else 'SIGTERM/SIGUSR1'}: not recorded "
                            "(no best checkpoint, no --patience count)")
                raise Interrupted()
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


def _is_better(value: float, best: Optional[float], maximize: bool) -> bool:
    return best is None or (value > best if maximize else value < best)
