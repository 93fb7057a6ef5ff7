"""Numeric precision as one component: the base every registered precision builds on.

It owns autocast, backward, unscaling, the decision whether an update's gradient may be applied, and
its own state, so precisions slot in without the training step changing. This base computes in float32,
or in an autocast dtype, with no loss scale (fp32, bf16, memory_efficient_bf16 build it as it is); fp16's
loss scaling subclasses it (``fp16.py``). Which precision a run has is the registry's (``choose.py``).
"""
import contextlib
import logging
from typing import Dict, Optional

import torch

from shardtrain.trainer.precision.diverged import diverged_at

logger = logging.getLogger(__name__)


class Precision:
    """fp32 compute, or autocast to ``autocast_dtype``; NaN/inf updates stop the run (or are skipped, --skip-nan-updates)."""

    def __init__(self, autocast_dtype: Optional[torch.dtype] = None, device_type: str = "cpu",
                 param_dtype: Optional[torch.dtype] = None, skip_nan: int = 0):
        """``autocast_dtype``: compute dtype for ``torch.autocast``, or None when the
        parameters themselves are fp32 compute (or the backend casts them);
        ``param_dtype``: the dtype the model is stored in, if not fp32 (prepare_model casts it);
        ``skip_nan``: how many NaN/inf updates in a row are skipped rather than fatal."""
        self.autocast_dtype, self.device_type, self.param_dtype = autocast_dtype, device_type, param_dtype
        self.skip_nan, self.nan_in_a_row = skip_nan, 0

    def may_skip(self) -> bool:
        """Whether :meth:`accept` may answer False (skip an update) rather than accept or raise."""
        return self.skip_nan > 0

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def unscale_factor(self) -> float:
        """What the accumulated gradients are multiplied by to undo ``backward``'s scaling."""
        return 1.0

    def step(self, optimizer, backend, params, grad_multiplier: float) -> None:
        """Apply ``grad_multiplier`` (unscaling, 1/sample size, clipping) to the gradients, then step.

        An optimizer with a ``grad_multiplier`` (cpu_adam, adafactor) applies it as it reads each
        gradient, in fp32; for the others the backend multiplies the gradients in place first."""
        stepping = innermost(optimizer)
        if hasattr(stepping, "grad_multiplier"):
            stepping.grad_multiplier = grad_multiplier
        else:
            backend.multiply_grads(params, grad_multiplier)
        optimizer.step()

    def accept(self, grad_norm: torch.Tensor, update: int) -> bool:
        """Whether update number ``update`` may apply its gradient (norm ``grad_norm``,
        the same on every rank); False skips it."""
        if torch.isfinite(grad_norm):
            self.nan_in_a_row = 0
            return True
        self.nan_in_a_row += 1
        if self.nan_in_a_row <= self.skip_nan:
            why = ("--spike-rollback rolls it back" if self.skip_nan == EVERY_UPDATE
                   else f"{self.nan_in_a_row} in a row, --skip-nan-updates {self.skip_nan}")
            logger.warning(f"the loss or gradient is NaN/inf at update {update}; skipping it ({why})")
            return False
        raise diverged_at(update, self.skip_nan)  # the loop names the checkpoint (TrainingDivergedError)

    def metrics(self) -> Dict[str, float]:
        return {}

    def state_dict(self) -> Dict:
        return {}

    def load_state_dict(self, state: Dict) -> None:
        pass


def innermost(optimizer):
    """The optimizer that steps (inside ZeroRedundancyOptimizer's ``optim``)."""
    while not hasattr(optimizer, "grad_multiplier") and hasattr(optimizer, "optim"):
        optimizer = optimizer.optim
    return optimizer




def skip_nan(cfg) -> int:
    """NaN/inf updates skipped in a row before the run stops: --skip-nan-updates, or under
    --spike-rollback all (the spike guard rolls such an update back, and stops after too many)."""
    return EVERY_UPDATE if cfg.optimization.spike_rollback else cfg.optimization.skip_nan_updates


EVERY_UPDATE = 2 ** 62  # skip_nan under --spike-rollback: no user's count, so never shown as one
