"""Counters and random-number state of a run, as one Stateful object."""
import dataclasses
import random
from typing import Dict, Optional

import torch


@dataclasses.dataclass
class TrainState:
    num_updates: int = 0
    best: Optional[float] = None  # best validation metric so far
    num_bad_validations: int = 0  # for --patience
    prev_training_time: float = 0.0  # seconds spent in earlier runs (for --stop-time-hours)

    def state_dict(self) -> Dict:
        return {**dataclasses.asdict(self), "rng": rng_state()}

    def load_state_dict(self, state: Dict, restore_rng: bool = True) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, state.get(f.name, getattr(self, f.name)))
        if restore_rng and "rng" in state:
            set_rng_state(state["rng"])


def rng_state() -> Dict:
    """Every RNG a training step consumes (dropout): torch CPU, CUDA, Python."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuple(value):
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value
