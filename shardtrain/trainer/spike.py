"""``--spike-rollback``: a long run that heals itself from a loss spike.

A spike is a loss far above its recent history (``--spike-factor`` x the median of the last
``--spike-window`` accepted updates) or a NaN/inf one. The loss judged is the one the run logs for
the update: its summed loss over every batch and rank divided by their summed sample size (the
sample-size-weighted mean, in base 2, as fairseq's ``loss``), so every rank sees the same spike at
the same update and rolls back together, without a collective of its own.

The rule's history holds only accepted values: nothing is judged until it holds ``--spike-window``
of them, a spike never joins it, and a rollback puts back the history as it was at the snapshot (the
undone updates' values are forgotten), which is the history of a run given the skipped windows as
``--skip-batches``; so the run judges on exactly as that run would. More than
``--spike-max-rollbacks`` rollbacks within the horizon (``10 x --spike-window`` updates: the spike
at update ``u`` counts every earlier rollback at an update above ``u - horizon``) stop the run.

Rolling back restores this rank's state as it was after the last snapshot (``--spike-snapshot-
interval`` updates apart): its own parameter shards and buffers, its optimizer state, the lr
schedule, the precision's loss scale, the update count and its random generators. The data
iterator is *not* restored: the batches consumed since the snapshot (the spike's among them) are
skipped, so training continues exactly as a run whose data never held them. The snapshot lives in
memory, per rank, as local tensors (no gathering): it costs one copy of this rank's state and
works the same under every backend. Too many rollbacks close together stop the run.

Optionally the gradient norm is judged too (``--spike-gnorm-factor``, against its own median),
and each rollback multiplies the learning rate by ``--spike-lr-scale`` for the rest of the run.
Every skipped window is logged and recorded (``EPOCH:FIRST-LAST`` of each rank's batches, the
form ``--skip-batches`` takes) in the checkpoint, so a run can be replayed without them. A
snapshot is also taken where each epoch begins, so a window never spans two epochs.
"""
import collections
import logging
import math
import statistics
from typing import Dict, List, Optional, Tuple

import torch

from shardtrain.data.batch_windows import Window, format_windows
from shardtrain.trainer.checkpoint.async_staging import wait_for_live_writes
from shardtrain.trainer.checkpoint.contents import trainer_state_parts
from shardtrain.trainer.precision.diverged import TrainingDivergedError
from shardtrain.trainer.rng import rng_state, set_rng_state

logger = logging.getLogger(__name__)
LN2 = math.log(2)  # the criterions log losses in base 2 (fairseq's convention): judged in that unit


class SpikeRule:
    """Judges each update's value (its loss, or its gradient norm) against the median of the last
    ``window`` accepted ones: until ``window`` values are accepted only NaN/inf is a spike; then a
    value strictly above ``factor`` x their median (the mean of the middle two for an even window) is.
    A value judged a spike does not join the history."""

    def __init__(self, factor: float, window: int, what: str = "loss", flag: str = "--spike-factor"):
        self.factor, self.history = factor, collections.deque(maxlen=window)
        self.what, self.flag = what, flag

    def judge(self, value: float) -> Optional[str]:
        """Why ``value`` is a spike, or None (then it joins the history)."""
        if not math.isfinite(value):
            return f"the {self.what} is {value}"
        if len(self.history) == self.history.maxlen:
            median = statistics.median(self.history)
            if value > self.factor * median:
                return (f"the {self.what} {value:.4g} is above {self.factor:g} x {median:.4g}, the median of the "
                        f"last {len(self.history)} updates ({self.flag})")
        self.history.append(value)
        return None


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _innermost(optimizer):
    """The optimizer holding the state (inside ZeroRedundancyOptimizer's ``optim``: this rank's part)."""
    while hasattr(optimizer, "optim"):
        optimizer = optimizer.optim
    return optimizer


def _copy(value):
    if torch.is_tensor(value):
        return _local(value).detach().clone()
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


class Snapshot:
    """This rank's trainer state, copied: local tensors only, so taking one is no collective."""

    def __init__(self, trainer, update: int, position: Tuple[int, int], histories: List[List[float]]):
        self.update, self.position, self.histories = update, position, histories
        model = trainer.model
        self.tensors = [_copy(t) for t in list(model.parameters()) + list(model.buffers())]
        stepping = _innermost(trainer.optimizer)
        self.optimizer_state = {id(p): _copy(s) for p, s in stepping.state.items()}
        self.groups = [{k: v for k, v in g.items() if k != "params"} for g in stepping.param_groups]
        self.parts = {name: _copy(part.state_dict()) for name, part in trainer_state_parts(trainer).items()}
        self.rng = rng_state()

    def restore(self, trainer) -> None:
        # --async-save writes CPU parameters and optimizer state from the live tensors and only optimizer
        # steps wait for it: the copies below must too, or the checkpoint would hold this snapshot's values
        if wait_for_live_writes():
            logger.info("the rollback waited for a background checkpoint write (--async-save) to land")
        model = trainer.model
        with torch.no_grad():
            for live, saved in zip(list(model.parameters()) + list(model.buffers()), self.tensors):
                _local(live).copy_(saved)
        stepping = _innermost(trainer.optimizer)
        for p in [p for g in stepping.param_groups for p in g["params"]]:
            saved = self.optimizer_state.get(id(p))
            if saved is None:  # no state yet at the snapshot (before the first step)
                stepping.state.pop(p, None)
                continue
            live = stepping.state[p]
            for key, value in saved.items():  # into the live tensors: they may be DTensors (fully_sharded)
                if torch.is_tensor(value):
                    _local(live[key]).copy_(value)
                else:
                    live[key] = value
        for group, saved in zip(stepping.param_groups, self.groups):
            group.update(saved)
        for name, part in trainer_state_parts(trainer).items():
            part.load_state_dict(_copy(self.parts[name]))
        set_rng_state(self.rng)


def logged_loss(out: Dict) -> float:
    """The update's loss as the run logs it: summed over batches and ranks, divided by the summed
    sample size (criterions.Criterion.reduce_metrics), in base 2."""
    logs = out["logs"][0] if out["logs"] else {}
    return logs.get("loss", 0.0) / max(out["sample_size"], 1.0) / LN2


class SpikeGuard:
    """The loop's side of --spike-rollback: judge each update, snapshot, roll back."""

    def __init__(self, optimization_cfg):
        o = optimization_cfg
        self.rules = [SpikeRule(o.spike_factor, o.spike_window)]
        if o.spike_gnorm_factor > 0:
            self.rules.append(SpikeRule(o.spike_gnorm_factor, o.spike_window, "gradient norm", "--spike-gnorm-factor"))
        self.interval, self.max_rollbacks = o.spike_snapshot_interval, o.spike_max_rollbacks
        self.lr_factor = o.spike_lr_scale
        self.horizon = 10 * o.spike_window
        self.snapshot: Optional[Snapshot] = None
        self.rollbacks: List[int] = []  # the updates at which the run rolled back (within the horizon)
        self.skipped: List[Window] = []  # every window of batches skipped, in --skip-batches' form

    def take_snapshot(self, trainer, epoch: int, position: int) -> None:
        """Snapshot now: ``position`` batches of epoch ``epoch`` are consumed on this rank."""
        histories = [list(rule.history) for rule in self.rules]
        self.snapshot = Snapshot(trainer, trainer.num_updates, (epoch, position), histories)

    def begin_epoch(self, trainer, epoch: int, position: int) -> None:
        """Training (re)starts or enters a new epoch: a rollback never reaches across it."""
        if self.snapshot is None or self.snapshot.position[0] != epoch:
            self.take_snapshot(trainer, epoch, position)

    def after_update(self, trainer, out: Dict, epoch: int, position: int) -> bool:
        """Judge the update ``out`` reports, after which ``position`` batches of ``epoch`` are consumed;
        True when it rolled back (the update is undone and its batches skipped)."""
        values = [logged_loss(out), out["gnorm"]]
        reasons = [rule.judge(value) for rule, value in zip(self.rules, values)
                   if rule.what == "loss" or out["stepped"]]  # an fp16 overflow's norm is no spike
        reason = next((r for r in reasons if r is not None), None)
        if reason is None:
            if out["stepped"] and trainer.num_updates % self.interval == 0:
                self.take_snapshot(trainer, epoch, position)
            return False
        self._roll_back(trainer, reason, trainer.num_updates + (0 if out["stepped"] else 1), epoch, position)
        return True

    def _roll_back(self, trainer, reason: str, update: int, epoch: int, position: int) -> None:
        self.rollbacks = [u for u in self.rollbacks if u > update - self.horizon] + [update]
        if len(self.rollbacks) > self.max_rollbacks:
            raise TrainingDivergedError(
                f"{len(self.rollbacks)} spikes within {self.horizon} updates (the last at update {update}: "
                f"{reason}); stopping after --spike-max-rollbacks {self.max_rollbacks}. The data or the learning "
                f"rate is the likelier cause: lower --lr, add warmup, set --clip-norm, or check the data there.")
        snapshot = self.snapshot
        window = (epoch, snapshot.position[1] + 1, position)
        self.skipped.append(window)
        scale = trainer.lr_scheduler.lr_scale * self.lr_factor  # the schedule keeps it (restore resets it)
        snapshot.restore(trainer)
        for rule, history in zip(self.rules, snapshot.histories):  # the undone updates' values are forgotten
            rule.history.clear()
            rule.history.extend(history)
        trainer.lr_scheduler.set_lr_scale(scale)
        lr = f"; the learning rate is now {scale:g} x the schedule's" if self.lr_factor != 1.0 else ""
        logger.warning(f"spike at update {update}: {reason}. Rolled back to update {snapshot.update} and "
                       f"skipped batches {format_windows([window])} (epoch:first-last, on every rank){lr}; "
                       f"rollback {len(self.rollbacks)} of at most {self.max_rollbacks} within {self.horizon} "
                       f"updates")

    def metrics(self) -> Dict[str, float]:
        return {"rollbacks": float(len(self.skipped))}

    def state_dict(self) -> Dict:
        """What a checkpoint keeps: the values judged against, the recent rollbacks and every window
        skipped (the learning-rate scale is the schedule's state)."""
        return {"histories": [list(r.history) for r in self.rules], "loss_base": 2,
                "rollbacks": list(self.rollbacks), "skipped": [list(w) for w in self.skipped]}

    def load_state_dict(self, state: Dict) -> None:
        histories = [list(h) for h in state["histories"]]
        if state.get("loss_base") != 2 and histories:  # saved before the loss was judged in base 2: nats
            histories[0] = [value / LN2 for value in histories[0]]
        for rule, history in zip(self.rules, histories):
            rule.history.clear()
            rule.history.extend(history)
        self.rollbacks = list(state["rollbacks"])
        self.skipped = [tuple(w) for w in state["skipped"]]
