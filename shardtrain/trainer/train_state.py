"""Counters and random-number state of a run, and its training time, as Stateful objects."""
import dataclasses
import time
from typing import Dict, Optional

from shardtrain.trainer.rng import rng_state


@dataclasses.dataclass
class TrainState:
    num_updates: int = 0
    best: Optional[float] = None  # best validation metric so far
    num_bad_validations: int = 0  # for --patience

    def state_dict(self) -> Dict:
        # "rng" is rank 0's generators, kept for the files' layout; resume restores every
        # rank's own from the checkpoint's rng_per_rank instead (see rng.py, contents.py).
        return {**dataclasses.asdict(self), "rng": rng_state()}

    def load_state_dict(self, state: Dict) -> None:
        # Older checkpoints also hold prev_training_time, a stale copy of training_seconds: ignored.
        for f in dataclasses.fields(self):
            setattr(self, f.name, state.get(f.name, getattr(self, f.name)))


class TrainingClock:
    """Seconds trained over this run and the runs it resumed (for --stop-time-hours).
    Saved once, as the checkpoint's ``training_seconds``."""

    def __init__(self):
        self.previous, self.start = 0.0, time.time()

    def seconds(self) -> float:
        return self.previous + time.time() - self.start

    def state_dict(self) -> float:
        return self.seconds()

    def load_state_dict(self, seconds: float) -> None:
        self.previous = seconds
