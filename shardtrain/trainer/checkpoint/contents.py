"""What a checkpoint holds: one dict of stateful parts, built here and nowhere else.

Every part has ``state_dict()``/``load_state_dict()``; its name is its key on
disk (in the single file, or in a sharded directory's ``extra.pt``, where the
model and optimizer go to DCP instead). Beside the parts, a header the loading
side checks against the run rather than loads: the format version, the config
and the task's fingerprint. Saving is ``state_of(parts)``; resuming is
``load_parts(parts, state)`` over the parts a run keeps (see resume.py).
"""
from typing import Callable, Dict, List, Optional

from shardtrain.config.run_config import to_dict
from shardtrain.core import user_dir
from shardtrain.optim.registry import kernel_choice_kept
from shardtrain.trainer.rng import gather_rng_states, reseed_for_resume, rng_for_this_rank, set_rng_state

FORMAT_VERSION = 1
TENSOR_PARTS = ("model", "optimizer")  # a sharded directory stores these with DCP, the rest in extra.pt
SKIP = object()
NO_OPTIMIZER_STATE = "no_optimizer_state"  # header key of a checkpoint saved with --no-save-optimizer-state
# Older checkpoints lack some parts; what loading one of them means instead.
WHEN_MISSING = {"precision": {}, "meters": SKIP, "training_seconds": 0.0, "rng_per_rank": None, "spike_guard": SKIP}


def header(cfg, task_fingerprint) -> Dict:
    """Beside the config, the plugin folder (``--user-dir``) and the module it was imported as, so that
    loading from any working directory finds it (core/user_dir.py)."""
    return {"version": FORMAT_VERSION, "cfg": to_dict(cfg), "task_fingerprint": task_fingerprint,
            **user_dir.record(cfg.common.user_dir)}


def trainer_parts(trainer) -> Dict:
    """The trainer's own state."""
    return {"model": ModelPart(trainer.model, trainer.backend),
            "optimizer": OptimizerPart(trainer.model, trainer.optimizer, trainer.backend),
            **trainer_state_parts(trainer)}


def trainer_state_parts(trainer) -> Dict:
    """The trainer's parts besides its tensors (TENSOR_PARTS), which a --spike-rollback snapshot
    copies itself; these it keeps by their state dicts (spike.py)."""
    return {"lr_scheduler": trainer.lr_scheduler, "precision": trainer.precision, "train_state": trainer.state}


def stateful_parts(trainer, *, seed: int, clock, meters, make_epoch: Callable, epoch_itr=None,
                   spikes=None) -> Dict:
    """Everything a checkpoint of a run holds: the ``trainer``'s parts, the ``seed`` its ranks' generators
    re-seed from, the training ``clock``, the ``meters``, the data position and --spike-rollback's ``spikes``
    (None when off). ``make_epoch(epoch)`` makes an epoch's training iterator: loading, the saved epoch's
    (``epoch_itr`` is None then); saving, ``epoch_itr`` is the one trained on. Loaded in this order:
    train_state (the update count) comes before rng_per_rank, which re-seeds from it."""
    return {**trainer_parts(trainer),
            "rng_per_rank": RankRngs(seed, trainer.state),
            "training_seconds": clock,  # for --stop-time-hours on resume
            "train_iterator": TrainIterator(make_epoch, epoch_itr),
            "meters": meters,
            # --spike-rollback's recent losses and rollbacks (its snapshot is retaken after a resume)
            **({"spike_guard": spikes} if spikes is not None else {})}


def state_of(parts: Dict) -> Dict:
    return {name: part.state_dict() for name, part in parts.items()}


def load_parts(parts: Dict, state: Dict) -> None:
    for name, part in parts.items():
        if name in state:
            part.load_state_dict(state[name])
        elif name not in WHEN_MISSING:
            raise KeyError(f"the checkpoint has no {name!r}")
        elif WHEN_MISSING[name] is not SKIP:
            part.load_state_dict(WHEN_MISSING[name])


def without(parts: Dict, names: List[str]) -> Dict:
    return {name: part for name, part in parts.items() if name not in names}


class ModelPart:
    """The model's full state dict through the backend (gathered on rank 0 where it is sharded);
    with no backend, a plain module's (inference)."""

    def __init__(self, model, backend=None):
        self.model, self.backend = model, backend

    def state_dict(self) -> Dict:
        return self.backend.model_state_dict(self.model) if self.backend else self.model.state_dict()

    def load_state_dict(self, state: Dict) -> None:
        if self.backend is None:
            self.model.load_state_dict(state)
        else:
            self.backend.load_model_state_dict(self.model, state)


class OptimizerPart:
    """The optimizer's state keyed by parameter name, through the backend."""

    def __init__(self, model, optimizer, backend):
        self.model, self.optimizer, self.backend = model, optimizer, backend

    def state_dict(self) -> Dict:
        return self.backend.optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: Dict) -> None:
        with kernel_choice_kept(self.optimizer):
            self.backend.load_optimizer_state_dict(self.model, self.optimizer, state)


class RankRngs:
    """Every rank's generators, rank r's at index r (see rng.py). Saving is a collective
    (gathered to rank 0); on load each rank takes its own entry, or re-seeds from the
    seed and the update when another number of ranks saved them."""

    def __init__(self, seed: int, train_state):
        self.seed, self.train_state = seed, train_state

    def state_dict(self) -> Optional[List[Dict]]:
        return gather_rng_states()

    def load_state_dict(self, saved: Optional[List[Dict]]) -> None:
        own = rng_for_this_rank({"rng_per_rank": saved})
        if own is None:
            reseed_for_resume(saved, self.train_state.num_updates, self.seed)
        else:
            set_rng_state(own)


class TrainIterator:
    """The position in the training data. Loading it makes the saved epoch's iterator
    (``epoch_itr``, by ``make_epoch(epoch)``), placed where the checkpoint left off."""

    def __init__(self, make_epoch: Callable, epoch_itr=None):
        self.make_epoch, self.epoch_itr = make_epoch, epoch_itr

    def state_dict(self) -> Dict:
        return self.epoch_itr.state_dict()

    def load_state_dict(self, state: Dict) -> None:
        self.epoch_itr = self.make_epoch(state["epoch"])
        self.epoch_itr.load_state_dict(state)
