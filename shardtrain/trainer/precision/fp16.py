"""fp16: compute in float16 from fp32 weights, with a dynamic loss scale (``--fp16``, fairseq's ``--amp``).

The loss is scaled before backward and the gradients unscaled after it; an overflowing update is skipped
by every rank together and the scale lowered (``shardtrain.trainer.precision.loss_scaler`` holds the policy).
"""
from typing import Optional

import torch

from shardtrain.config.epoch_lists import first
from shardtrain.trainer.precision.loss_scaler import DynamicLossScaler
from shardtrain.trainer.precision.component import Precision
from shardtrain.trainer.precision.registry import PrecisionKind, register_precision


@register_precision("fp16")
class FP16(PrecisionKind):
    flags = ("fp16", "amp")  # --amp is fairseq's autocast fp16 with fp32 weights: this; only its scaler's flags differ
    compute = torch.float16
    loss_scaled = True
    planned = True

    @classmethod
    def build(cls, cfg, backend, dtypes):
        # a backend that casts the parameters itself (FSDP2's MixedPrecisionPolicy) needs no autocast
        autocast = None if backend.casts_params else dtypes.compute
        return LossScaledPrecision(build_scaler(cfg, backend.world_size), autocast, backend.device.type)


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
