"""Numeric precision as one component.

It owns autocast, backward and the optimizer step, and has its own state, so
bf16 and fp16 with a dynamic loss scaler slot in without the training step
changing. Only full precision exists so far.
"""
import contextlib
from typing import Dict

import torch


class Precision:
    name = "fp32"

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor) -> bool:
        """Apply the update; return False if it was skipped (e.g. fp16 overflow)."""
        optimizer.step()
        return True

    def metrics(self) -> Dict[str, float]:
        return {}

    def state_dict(self) -> Dict:
        return {}

    def load_state_dict(self, state: Dict) -> None:
        pass


def build_precision(cfg) -> Precision:
    return Precision()
