"""A --user-dir plugin: a precision of its own, registered in one file as the built-ins are. It computes in fp32
with a fixed loss scale of 2**10 (unscaled before the step), and records its use in USED."""
from shardtrain.trainer.precision.component import Precision
from shardtrain.trainer.precision.registry import PrecisionKind, register_precision

USED = {"built": 0, "backward": 0, "steps": 0}
SCALE = 2.0 ** 10


class FixedScalePrecision(Precision):
    def backward(self, loss):
        USED["backward"] += 1
        (loss * SCALE).backward()

    def unscale_factor(self):
        return 1.0 / SCALE

    def step(self, optimizer, backend, params, grad_multiplier):
        USED["steps"] += 1
        super().step(optimizer, backend, params, grad_multiplier)


@register_precision("toy_fixed_scale")
class ToyFixedScale(PrecisionKind):
    planned = True  # shard-plan weighs it

    @classmethod
    def build(cls, cfg, backend, dtypes):
        USED["built"] += 1
        return FixedScalePrecision(None, backend.device.type)
