"""Numeric precision as one component.

It owns autocast, backward and the optimizer step, and has its own state, so
precisions slot in without the training step changing. fp32, and bf16 by
autocast (or by the backend's own mixed-precision policy under FSDP, which
keeps fp32 sharded master weights and casts them per unit).
"""
import contextlib
from typing import Dict, Optional

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


class AutocastPrecision(Precision):
    """Low-precision compute by ``torch.autocast``; weights, grads and optimizer stay fp32."""

    def __init__(self, dtype: torch.dtype, device_type: str):
        self.name = str(dtype).replace("torch.", "")
        self.dtype, self.device_type = dtype, device_type

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.dtype)


def low_precision_dtype(common) -> Optional[torch.dtype]:
    return torch.bfloat16 if common.bf16 else torch.float16 if common.fp16 else None


def build_precision(cfg, backend) -> Precision:
    # --fp16 runs only under fully_sharded (its MixedPrecisionPolicy); config/checks.py refuses the rest
    # until dynamic loss scaling exists.
    if cfg.common.bf16 and not backend.casts_params:
        return AutocastPrecision(torch.bfloat16, backend.device.type)
    return Precision()
