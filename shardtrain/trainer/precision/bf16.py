"""bf16: compute in bfloat16 from fp32 weights (``--bf16``); bfloat16's range needs no loss scale."""
import torch

from shardtrain.trainer.precision.component import Precision, skip_nan
from shardtrain.trainer.precision.registry import PrecisionKind, register_precision


@register_precision("bf16")
class BF16(PrecisionKind):
    flags = ("bf16",)
    compute = torch.bfloat16
    planned = True

    @classmethod
    def build(cls, cfg, backend, dtypes):
        # a backend that casts the parameters itself (FSDP2's MixedPrecisionPolicy) needs no autocast
        autocast = None if backend.casts_params else dtypes.compute
        return Precision(autocast, backend.device.type, skip_nan=skip_nan(cfg))
