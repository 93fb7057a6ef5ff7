"""fairseq's --memory-efficient-fp16: the model stored in float16, the optimizer keeping fp32 state."""
import torch

from shardtrain.trainer.precision.fp16 import LossScaledPrecision, build_scaler
from shardtrain.trainer.precision.registry import PrecisionKind, register_precision


@register_precision("memory_efficient_fp16")
class MemoryEfficientFP16(PrecisionKind):
    flags = ("memory_efficient_fp16",)
    implies = ("fp16",)  # as in fairseq
    compute = torch.float16
    stores_in_compute = True
    loss_scaled = True

    @classmethod
    def build(cls, cfg, backend, dtypes):
        # the parameters are fp16 themselves: nothing to autocast
        return MemoryEfficientFP16Precision(build_scaler(cfg, backend.world_size), None, backend.device.type,
                                            dtypes.storage)


class MemoryEfficientFP16Precision(LossScaledPrecision):
    """fairseq's --memory-efficient-fp16: parameters and gradients stored in fp16, the
    optimizer (cpu_adam, adafactor) keeps fp32 state. The gradients stay scaled in fp16
    and an optimizer with a ``grad_multiplier`` (cpu_adam, adafactor) applies the multiplier
    to each one once it is fp32: unscaled in place they would be true gradients in fp16, whose
    small entries flush to zero, and an adaptive optimizer would then miss their whole update.
    A plugin's optimizer registered with supports_memory_efficient_fp16 but without one gets
    its gradients unscaled in place first, as fairseq's do (Precision.step)."""
