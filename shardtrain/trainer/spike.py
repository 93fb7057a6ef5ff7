"""``--spike-rollback``: a long run that heals itself from a loss spike.

A spike is a loss far above its recent history (``--spike-factor`` x the median of the last
``--spike-window`` accepted updates) or a NaN/inf one. The loss judged is the update's mean over
every rank (its logs are summed across ranks), so every rank sees the same spike at the same
update and rolls back together, without a collective of its own.

Rolling back restores this rank's state as it was after the last snapshot (``--spike-snapshot-
interval`` updates apart): its own parameter shards and buffers, its optimizer state, the lr
schedule, the precision's loss scale, the update count and its random generators. The data
iterator is *not* restored: the batches consumed since the snapshot (the spike's among them) are
skipped, so training continues exactly as a run whose data never held them. The snapshot lives in
memory, per rank, as local tensors (no gathering): it costs one copy of this rank's state and
works the same under every backend. Too many rollbacks close together stop the run.
"""
import collections
import logging
import math
import statistics
from typing import Dict, List, Optional

import torch

from shardtrain.trainer.precision import TrainingDivergedError
from shardtrain.trainer.rng import rng_state, set_rng_state

logger = logging.getLogger(__name__)


class SpikeRule:
    """Judges each update's loss against the median of the last ``window`` accepted ones."""

    def __init__(self, factor: float, window: int):
        self.factor, self.history = factor, collections.deque(maxlen=window)

    def judge(self, loss: float) -> Optional[str]:
        """Why ``loss`` is a spike, or None (then it joins the history)."""
        if not math.isfinite(loss):
            return f"the loss is {loss}"
        if len(self.history) == self.history.maxlen:
            median = statistics.median(self.history)
            if loss > self.factor * median:
                return (f"the loss {loss:.4g} is above {self.factor:g} x {median:.4g}, the median of the last "
                        f"{len(self.history)} updates (--spike-factor)")
        self.history.append(loss)
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

    def __init__(self, trainer, update: int, batches: int):
        self.update, self.batches = update, batches
        model = trainer.model
        self.tensors = [_copy(t) for t in list(model.parameters()) + list(model.buffers())]
        stepping = _innermost(trainer.optimizer)
        self.optimizer_state = {id(p): _copy(s) for p, s in stepping.state.items()}
        self.groups = [{k: v for k, v in g.items() if k != "params"} for g in stepping.param_groups]
        self.parts = {name: _copy(part.state_dict()) for name, part in _parts(trainer).items()}
        self.rng = rng_state()

    def restore(self, trainer) -> None:
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
        for name, part in _parts(trainer).items():
            part.load_state_dict(_copy(self.parts[name]))
        set_rng_state(self.rng)


def _parts(trainer) -> Dict:
    return {"lr_scheduler": trainer.lr_scheduler, "precision": trainer.precision, "train_state": trainer.state}


class SpikeGuard:
    """The loop's side of --spike-rollback: judge each update, snapshot, roll back."""

    def __init__(self, optimization_cfg):
        o = optimization_cfg
        self.rule = SpikeRule(o.spike_factor, o.spike_window)
        self.interval, self.max_rollbacks = o.spike_snapshot_interval, o.spike_max_rollbacks
        self.horizon = 10 * o.spike_window
        self.snapshot: Optional[Snapshot] = None
        self.rollbacks: List[int] = []  # the updates at which the run rolled back
        self.batches = 0  # batches consumed by updates so far (for the log)

    def start(self, trainer) -> None:
        """The first snapshot: the state training starts (or resumes) from."""
        self.snapshot = Snapshot(trainer, trainer.num_updates, self.batches)

    def after_update(self, trainer, out: Dict, batches: int) -> bool:
        """Judge the update ``out`` reports (made of ``batches`` batches); True when it rolled back
        (the update is undone)."""
        self.batches += batches
        logs = out["logs"][0] if out["logs"] else {}
        loss = logs.get("loss", 0.0) / max(out["sample_size"], 1.0)
        reason = self.rule.judge(loss)
        if reason is None:
            if out["stepped"] and trainer.num_updates % self.interval == 0:
                self.snapshot = Snapshot(trainer, trainer.num_updates, self.batches)
            return False
        self._roll_back(trainer, reason, trainer.num_updates + (0 if out["stepped"] else 1))
        return True

    def _roll_back(self, trainer, reason: str, update: int) -> None:
        self.rollbacks = [u for u in self.rollbacks if u > update - self.horizon] + [update]
        if len(self.rollbacks) > self.max_rollbacks:
            raise TrainingDivergedError(
                f"{len(self.rollbacks)} loss spikes within {self.horizon} updates (the last at update {update}: "
                f"{reason}); stopping after --spike-max-rollbacks {self.max_rollbacks}. The data or the learning "
                f"rate is the likelier cause: lower --lr, add warmup, set --clip-norm, or check the data there.")
        skipped = self.batches - self.snapshot.batches
        self.snapshot.restore(trainer)
        logger.warning(f"loss spike at update {update}: {reason}. Rolled back to update {self.snapshot.update} "
                       f"and skipped the {skipped} batches per rank since it (rollback {len(self.rollbacks)} of at "
                       f"most {self.max_rollbacks} within {self.horizon} updates)")

    def metrics(self) -> Dict[str, float]:
        return {"rollbacks": float(len(self.rollbacks))}

    def state_dict(self) -> Dict:
        """What a checkpoint keeps: the losses judged against and the recent rollbacks."""
        return {"history": list(self.rule.history), "rollbacks": list(self.rollbacks)}

    def load_state_dict(self, state: Dict) -> None:
        self.rule.history.clear()
        self.rule.history.extend(state["history"])
        self.rollbacks = list(state["rollbacks"])
