"""fairseq's --memory-efficient-bf16: the model stored in bfloat16, the optimizer keeping fp32 state."""
import torch

from shardtrain.trainer.precision.component import Precision, skip_nan
from shardtrain.trainer.precision.registry import PrecisionKind, register_precision


@register_precision("memory_efficient_bf16")
class MemoryEfficientBF16(PrecisionKind):
    flags = ("memory_efficient_bf16",)
    implies = ("bf16",)  # as in fairseq
    compute = torch.bfloat16
    stores_in_compute = True

    @classmethod
    def build(cls, cfg, backend, dtypes):
        # bf16 parameters: nothing to autocast, no loss scale
        return Precision(None, backend.device.type, dtypes.storage, skip_nan=skip_nan(cfg))
