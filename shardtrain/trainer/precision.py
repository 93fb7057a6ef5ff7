"""Numeric precision as one component.

It owns autocast, backward, unscaling, the decision whether an update's
gradient may be applied, and its own state, so precisions slot in without the
training step changing:

- fp32;
- bf16: autocast, or the backend's own mixed-precision policy under FSDP
  (fp32 sharded master weights cast per unit), no loss scaling needed;
- fp16: the same compute paths plus dynamic loss scaling
  (``shardtrain.trainer.loss_scaler``): overflowing updates are skipped by
  every rank together and the scale adapts.

The dtypes are decided once, here (:func:`run_dtypes`): what the model is
stored in (``prepare_model`` casts it), what it computes in, and the FSDP2
policy handed to a backend that casts the parameters itself.
"""
import contextlib
import dataclasses
import logging
from typing import Dict, Optional

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from shardtrain.config.epoch_lists import first
from shardtrain.config.sections import chosen_precision
from shardtrain.core.errors import ShardtrainError
from shardtrain.trainer.loss_scaler import DynamicLossScaler

logger = logging.getLogger(__name__)


class TrainingDivergedError(ShardtrainError):
    """The loss or gradient became NaN/inf. The error of update ``update`` says whether a checkpoint is intact,
    which the checkpoint code knows and the precision does not: the loop re-raises it ``naming`` the newest
    checkpoint this run checked finite (CheckpointManager.last_checked_save)."""

    def __init__(self, message: str, update: Optional[int] = None, skip_nan: int = 0):
        super().__init__(message)
        self.update, self.skip_nan = update, skip_nan

    def naming(self, checked_save: Optional[str]) -> "TrainingDivergedError":
        if self.update is None:  # not an update's (--spike-max-rollbacks): it names no checkpoint
            return self
        return diverged_at(self.update, self.skip_nan, checked_save)


def diverged_at(update: int, skip_nan: int, checked_save: Optional[str] = None) -> TrainingDivergedError:
    """Update ``update``'s loss or gradient is NaN/inf, after ``skip_nan`` such updates skipped in a row;
    ``checked_save``: the newest checkpoint this run saved after checking it finite, or None."""
    skipped = f" after skipping {skip_nan} in a row (--skip-nan-updates)" if skip_nan else ""
    return TrainingDivergedError(
        f"The loss or gradient is NaN/inf at update {update}{skipped}; stopping before the weights are "
        f"corrupted ({_last_checkpoint(checked_save)}). Lower --lr, add warmup (--warmup-updates), "
        f"set --clip-norm, or check the data of this update"
        f"{'' if skip_nan else ' (or pass over such updates with --skip-nan-updates N)'}.", update, skip_nan)


def _last_checkpoint(checked_save: Optional[str]) -> str:
    """Only a checkpoint this run checked finite may be called intact."""
    if checked_save is not None:
        return f"the last checkpoint this run saved, {checked_save}, was checked finite"
    return ("this run saved no checkpoint yet; if it resumed from one, that checkpoint was not checked "
            "and may hold NaN/inf itself")


class Precision:
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
        stepping = _innermost(optimizer)
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
            logger.warning(f"the loss or gradient is NaN/inf at update {update}; skipping it "
                           f"({self.nan_in_a_row} in a row, --skip-nan-updates {self.skip_nan})")
            return False
        raise diverged_at(update, self.skip_nan)  # the loop names the checkpoint (TrainingDivergedError)

    def metrics(self) -> Dict[str, float]:
        return {}

    def state_dict(self) -> Dict:
        return {}

    def load_state_dict(self, state: Dict) -> None:
        pass


class LossScaledPrecision(Precision):
    """fp16: the loss is scaled before backward and the gradients unscaled after it;
    an update whose (global) gradient norm is inf/NaN is skipped and the scale lowered."""

    def __init__(self, scaler: DynamicLossScaler, autocast_dtype: Optional[torch.dtype] = None,
                 device_type: str = "cpu", param_dtype: Optional[torch.dtype] = None):
        super().__init__(autocast_dtype, device_type, param_dtype)
        self.scaler = scaler

    def backward(self, loss):
        (loss * self.scaler.loss_scale).backward()

    def unscale_factor(self):
        return 1.0 / self.scaler.loss_scale

    def may_skip(self):
        return True  # an overflow skips the update

    def accept(self, grad_norm, update):
        # grad_norm is a global norm (a collective under every backend), so an
        # inf in any rank's gradient shard makes every rank take this branch.
        if torch.isfinite(grad_norm):
            self.scaler.update()
            return True
        self.scaler.overflow(update)
        return False

    def metrics(self):
        return {"loss_scale": self.scaler.loss_scale}

    def state_dict(self):
        return {"loss_scaler": self.scaler.state_dict()}

    def load_state_dict(self, state):
        if "loss_scaler" in state:  # absent in checkpoints from fp32/bf16 runs: keep --fp16-init-scale
            self.scaler.load_state_dict(state["loss_scaler"])


class MemoryEfficientFP16Precision(LossScaledPrecision):
    """fairseq's --memory-efficient-fp16: parameters and gradients stored in fp16, the
    optimizer (cpu_adam, adafactor) keeps fp32 state. The gradients stay scaled in fp16
    and the optimizer applies the multiplier to each one once it is fp32: unscaled in
    place (as fairseq does) they would be true gradients in fp16, whose small entries
    flush to zero, and an adaptive optimizer would then miss their whole update."""

    def step(self, optimizer, backend, params, grad_multiplier):
        # the config checks allow --memory-efficient-fp16 only with optimizers that take it
        assert hasattr(_innermost(optimizer), "grad_multiplier"), type(optimizer)
        super().step(optimizer, backend, params, grad_multiplier)


def _innermost(optimizer):
    """The optimizer that steps (inside ZeroRedundancyOptimizer's ``optim``)."""
    while not hasattr(optimizer, "grad_multiplier") and hasattr(optimizer, "optim"):
        optimizer = optimizer.optim
    return optimizer


# What each --fp16/--bf16/--memory-efficient-fp16 choice (config.sections.chosen_precision) computes in.
_COMPUTE_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16, "memory_efficient_fp16": torch.float16,
                   "memory_efficient_bf16": torch.bfloat16}
# Precisions whose model itself is stored in the compute dtype (fairseq's memory-efficient fp16/bf16).
LOW_PRECISION_STORAGE = ("memory_efficient_fp16", "memory_efficient_bf16")


@dataclasses.dataclass(frozen=True)
class Dtypes:
    """The dtypes of a run, decided once (:func:`decide_dtypes`)."""
    name: str  # fp32, bf16, fp16 or memory_efficient_fp16
    compute: Optional[torch.dtype]  # low-precision compute, None for fp32
    storage: Optional[torch.dtype]  # what the model itself is cast to, None to keep it fp32
    policy: MixedPrecisionPolicy  # for a backend that casts the parameters itself (FSDP2)


def decide_dtypes(name: str, reduce_in_low_precision: bool) -> Dtypes:
    compute = _COMPUTE_DTYPES[name]
    # fairseq's memory-efficient fp16: the model itself is stored in fp16 (parameters and
    # gradients, also what DDP all-reduces); the optimizer (cpu_adam) keeps fp32 state.
    storage = compute if name in LOW_PRECISION_STORAGE else None
    return Dtypes(name, compute, storage, mixed_precision(compute, reduce_in_low_precision))


def _skip_nan(cfg) -> int:
    """NaN/inf updates skipped in a row before the run stops: --skip-nan-updates, or under
    --spike-rollback all (the spike guard rolls such an update back, and stops after too many)."""
    return 2 ** 62 if cfg.optimization.spike_rollback else cfg.optimization.skip_nan_updates


def run_dtypes(cfg) -> Dtypes:
    """The one place a run's precision flags become dtypes."""
    return decide_dtypes(chosen_precision(cfg.common), cfg.distributed.reduce_in_low_precision)


def mixed_precision(param_dtype: Optional[torch.dtype], reduce_in_low_precision: bool) -> MixedPrecisionPolicy:
    """Compute in ``param_dtype`` from fp32 sharded master weights; reduce gradients in fp32
    unless asked otherwise."""
    if param_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=param_dtype,
                                reduce_dtype=param_dtype if reduce_in_low_precision else torch.float32)


_GRAD_SCALER_GROWTH_INTERVAL = 2000


def build_scaler(cfg, world_size: int) -> DynamicLossScaler:
    common = cfg.common
    if common.amp and not common.fp16:  # fairseq's --amp: torch's GradScaler, growth interval 2000 by default
        init_scale, window = common.amp_init_scale, common.amp_scale_window or _GRAD_SCALER_GROWTH_INTERVAL
    else:
        init_scale, window = common.fp16_init_scale, common.fp16_scale_window
    if window is None:  # fairseq's default: about 2**14 samples' worth of updates
        window = max(1, int(2 ** 14 / world_size / first(cfg.optimization.update_freq)))
    return DynamicLossScaler(init_scale=init_scale, scale_window=window,
                             tolerance=common.fp16_scale_tolerance, threshold=common.threshold_loss_scale,
                             min_loss_scale=common.min_loss_scale,
                             stop_at_min_scale=not common.fp16_no_stop_at_min_scale)


def build_precision(cfg, backend, dtypes: Dtypes) -> Precision:
    if dtypes.name == "memory_efficient_bf16":  # bf16 parameters: no autocast, no loss scale
        return Precision(None, backend.device.type, dtypes.storage, skip_nan=_skip_nan(cfg))
    if dtypes.storage is not None:  # the parameters are fp16 themselves: nothing to autocast
        return MemoryEfficientFP16Precision(build_scaler(cfg, backend.world_size), None, backend.device.type,
                                            dtypes.storage)
    # Backends that cast parameters themselves (FSDP's MixedPrecisionPolicy) need no autocast.
    autocast = None if backend.casts_params else dtypes.compute
    if dtypes.name == "fp16":
        return LossScaledPrecision(build_scaler(cfg, backend.world_size), autocast, backend.device.type)
    return Precision(autocast, backend.device.type, skip_nan=_skip_nan(cfg))
