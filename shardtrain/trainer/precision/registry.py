"""The precision registry: every fact a room asks of a precision, said once on its class.

A precision is one registered :class:`PrecisionKind` subclass in its own file (``fp32.py``, ``bf16.py``,
...), imported by ``choose.py``; a plugin registers one from a ``--user-dir`` module the same way. The
flag checks, ``--precision``'s choices, shard-plan's alternatives, the fit check's byte counts, the CPU
warning and the inference commands' dtype all read these attributes, never a precision's name, so a new
precision is its file plus one import line (Lightning Fabric's precision plug-ins are the model).
"""
import dataclasses
from typing import Optional, Tuple

import torch

from shardtrain.core.errors import ConfigError
from shardtrain.core.registry import Registry

PRECISION_REGISTRY = Registry("precision")


class PrecisionKind:
    """What a precision is (class attributes) and the component it builds (:meth:`build`)."""
    name: str = ""  # set by :func:`register_precision`
    #: fairseq's boolean flags (CommonConfig fields) that pick this precision, as well as ``--precision NAME``
    flags: Tuple[str, ...] = ()
    #: precisions whose flags this one's flags imply (``--memory-efficient-fp16`` implies ``--fp16``): given
    #: together, this one is meant, and the pair is no contradiction
    implies: Tuple[str, ...] = ()
    #: the dtype it computes in (autocast, or a backend's own mixed-precision policy); None: float32
    compute: Optional[torch.dtype] = None
    #: the model itself (parameters and gradients) is stored in ``compute``, not float32
    stores_in_compute: bool = False
    #: a dynamic loss scale owns overflowing updates (which --skip-nan-updates would otherwise skip)
    loss_scaled: bool = False
    #: shard-plan weighs it as an alternative to the precision asked for
    planned: bool = False

    @classmethod
    def build(cls, cfg, backend, dtypes: "Dtypes"):
        """The :class:`~shardtrain.trainer.precision.component.Precision` of a run on ``backend``."""
        raise NotImplementedError(f"precision {cls.name!r} builds no component")


def register_precision(name: str):
    """Decorator: ``@register_precision("bf16")`` on a :class:`PrecisionKind` subclass."""
    def decorator(cls):
        if not (isinstance(cls, type) and issubclass(cls, PrecisionKind)):
            raise TypeError(f"precision {name!r}: register a PrecisionKind subclass, got {cls!r}")
        problem = attribute_problem(cls)
        if problem:
            raise ConfigError(f"Precision {name!r} ({cls.__module__}.{cls.__qualname__}) cannot be registered: "
                              f"{problem}. Fix the class's attributes and run again.")
        cls.name = name
        PRECISION_REGISTRY.add(name, cls)
        return cls
    return decorator


COMPUTE_DTYPES = (torch.float16, torch.bfloat16)  # what autocast and a casting backend compute in, besides fp32


def attribute_problem(cls: type) -> str:
    """What is wrong with a precision class's attributes (checked once, at registration), or ''."""
    if cls.compute is not None and cls.compute not in COMPUTE_DTYPES:
        return (f"its compute is {cls.compute!r} ({type(cls.compute).__name__}): it must be None (float32) or "
                "torch.float16 or torch.bfloat16, the dtypes autocast computes in (any other trains in float32)")
    wrong = [a for a in ("stores_in_compute", "loss_scaled", "planned") if not isinstance(getattr(cls, a), bool)]
    if wrong:
        return f"{wrong[0]} is {getattr(cls, wrong[0])!r}: it must be True or False"
    for attribute in ("flags", "implies"):
        value = getattr(cls, attribute)
        if not (isinstance(value, tuple) and all(isinstance(v, str) and v for v in value)):
            return f"{attribute} is {value!r}: it must be a tuple of names (('my_fp8',), or ())"
    taken = {flag: e.name for e in PRECISION_REGISTRY.entries() for flag in e.obj.flags}
    clash = next((flag for flag in cls.flags if flag in taken), None)
    if clash:
        return (f"its flag --{clash.replace('_', '-')} already picks the precision {taken[clash]!r}, and a flag "
                f"picks one precision: give it a flag of its own (a CommonConfig field) or none (--precision NAME "
                "picks it)")
    return ""


@dataclasses.dataclass(frozen=True)
class Dtypes:
    """The dtypes of a run, decided once (:func:`decide_dtypes`)."""
    name: str  # the registered precision's name
    compute: Optional[torch.dtype]  # low-precision compute, None for fp32
    storage: Optional[torch.dtype]  # what the model itself is cast to, None to keep it fp32
    reduce_in_low_precision: bool  # a casting backend reduces gradients in ``compute``

    @property
    def policy(self):
        """The ``MixedPrecisionPolicy`` of a backend that casts the parameters itself (FSDP2)."""
        return mixed_precision(self.compute, self.reduce_in_low_precision)


def decide_dtypes(kind: type, reduce_in_low_precision: bool) -> Dtypes:
    """``kind``'s dtypes; ``reduce_in_low_precision``: a casting backend reduces gradients in ``compute``."""
    storage = kind.compute if kind.stores_in_compute else None
    return Dtypes(kind.name, kind.compute, storage, reduce_in_low_precision)


def mixed_precision(param_dtype: Optional[torch.dtype], reduce_in_low_precision: bool):
    """FSDP2's ``MixedPrecisionPolicy``: compute in ``param_dtype`` from fp32 sharded master weights;
    reduce gradients in fp32 unless asked otherwise. FSDP2 is imported here, where a run wraps its
    model, not at the top: it costs ~2 s of start-up that a refusal or a pytorch_ddp run need not pay."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    if param_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=param_dtype,
                                reduce_dtype=param_dtype if reduce_in_low_precision else torch.float32)
