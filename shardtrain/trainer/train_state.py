"""Counters and random-number state of a run, as one Stateful object."""
import dataclasses
from typing import Dict, Optional

from shardtrain.trainer.rng import rng_state, set_rng_state


@dataclasses.dataclass
class TrainState:
    num_updates: int = 0
    best: Optional[float] = None  # best validation metric so far
    num_bad_validations: int = 0  # for --patience
    prev_training_time: float = 0.0  # seconds spent in earlier runs (for --stop-time-hours)

    def state_dict(self) -> Dict:
        # This rank's generators (rank 0's in a checkpoint); the checkpointers
        # save every rank's as rng_per_rank, and resume picks this rank's (see rng.py).
        return {**dataclasses.asdict(self), "rng": rng_state()}

    def load_state_dict(self, state: Dict, restore_rng: bool = True) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, state.get(f.name, getattr(self, f.name)))
        if restore_rng and "rng" in state:
            set_rng_state(state["rng"])
