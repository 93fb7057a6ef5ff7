"""fp32: float32 weights and compute (the default when no precision flag is given)."""
from shardtrain.trainer.precision.component import Precision, skip_nan
from shardtrain.trainer.precision.registry import PrecisionKind, register_precision


@register_precision("fp32")
class FP32(PrecisionKind):
    planned = True

    @classmethod
    def build(cls, cfg, backend, dtypes):
        return Precision(None, backend.device.type, skip_nan=skip_nan(cfg))
