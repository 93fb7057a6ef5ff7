"""Which precision a run has: the built-ins registered, and the one reading of the flags that pick one.

The imports below register the built-in precisions; their order is the order ``--precision`` lists them
in. A precision is picked by ``--precision NAME`` or by one of its fairseq flags (``--bf16``, ...); two
that pick different precisions are refused, naming both, unless one implies the other
(``--memory-efficient-fp16`` with ``--fp16``). Every room asks here, never the flags themselves.
"""
from typing import Dict, List, Optional

import torch

from shardtrain.core.errors import ConfigError
from shardtrain.trainer.precision.component import Precision
from shardtrain.trainer.precision.registry import PRECISION_REGISTRY, Dtypes, PrecisionKind, decide_dtypes
from shardtrain.trainer.precision import fp32  # noqa: F401  (registers; the order is --precision's)
from shardtrain.trainer.precision import bf16  # noqa: F401
from shardtrain.trainer.precision import fp16  # noqa: F401
from shardtrain.trainer.precision import memory_efficient_bf16  # noqa: F401
from shardtrain.trainer.precision import memory_efficient_fp16  # noqa: F401

DEFAULT = "fp32"  # what a run without a precision flag computes in


def user_choices() -> List[str]:
    """``--precision``'s choices: every registered precision, plugins' too, in registration order."""
    return [e.name for e in PRECISION_REGISTRY.entries()]


def kind(name: str) -> type:
    """The registered :class:`PrecisionKind` ``name`` (unknown names list the choices)."""
    return PRECISION_REGISTRY.get(name).obj


def flag_for(name: str) -> str:
    """How a user asks for precision ``name``: its first fairseq flag, else ``--precision NAME``."""
    flags = kind(name).flags
    return _flag(flags[0]) if flags else f"--precision {name}"


def kinds_with(capability: str) -> List[type]:
    """The registered precisions whose ``capability`` (a PrecisionKind attribute) is true."""
    return [e.obj for e in PRECISION_REGISTRY.entries() if getattr(e.obj, capability)]


def all_flags() -> List[str]:
    """Every config field that picks a precision: ``precision`` and each registered one's flags."""
    return ["precision"] + [f for e in PRECISION_REGISTRY.entries() for f in e.obj.flags]


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _given(common) -> List[tuple]:
    """(flag as typed, precision) for every flag of ``common`` that picks one (``common``: the run's common
    section, or an inference command's arguments, which have only some of the flags)."""
    given = []
    name = getattr(common, "precision", None)
    if name:
        given.append((f"--precision {name}", kind(name)))
    for entry in PRECISION_REGISTRY.entries():
        given += [(_flag(f), entry.obj) for f in entry.obj.flags if getattr(common, f, False)]
    return given


def _meant(given) -> Dict[str, type]:
    """The precisions ``given`` (:func:`_given`) asks for, less those another given one implies."""
    implied = {name for _, k in given for name in k.implies}
    return {k.name: k for _, k in given if k.name not in implied}


def conflict(common) -> Optional[str]:
    """The error when ``common``'s flags pick two precisions, or None."""
    given = _given(common)
    meant = _meant(given)
    if len(meant) < 2:
        return None
    flags = [flag for flag, k in given if k.name in meant]
    by_name = (f" (--precision NAME picks any of {', '.join(user_choices())} by name)"
               if hasattr(common, "precision") else "")  # the inference commands have no --precision
    return f"{' and '.join(flags)} both pick the precision, and differently ({' vs '.join(meant)}). Use one{by_name}."


def chosen(common) -> type:
    """The :class:`PrecisionKind` ``common``'s flags pick (:data:`DEFAULT` when none does)."""
    problem = conflict(common)
    if problem:
        raise ConfigError(problem)
    return next(iter(_meant(_given(common)).values()), None) or kind(DEFAULT)


def given_flag(common) -> str:
    """The flag that picked ``common``'s precision, as the user typed it (``--precision fp32`` if none did)."""
    name = chosen(common).name
    return next((flag for flag, k in _given(common) if k.name == name), f"--precision {name}")


def run_dtypes(cfg) -> Dtypes:
    """The one place a run's precision flags become dtypes."""
    return decide_dtypes(chosen(cfg.common), cfg.distributed.reduce_in_low_precision)


def build_precision(cfg, backend, dtypes: Dtypes):
    """The precision component of a run on ``backend`` with ``dtypes`` (:func:`run_dtypes`)."""
    chosen_kind = kind(dtypes.name)
    built = chosen_kind.build(cfg, backend, dtypes)
    if not isinstance(built, Precision):
        raise ConfigError(f"Precision {chosen_kind.name!r} ({chosen_kind.__module__}.{chosen_kind.__qualname__}): "
                          f"its build(cfg, backend, dtypes) returned {built!r}, not a "
                          "shardtrain.trainer.precision.component.Precision (or a subclass). Return the component "
                          "from build and run again.")
    return built


def inference_dtype(args) -> torch.dtype:
    """The dtype an inference command's ``--fp16``/``--bf16`` (``args``) load and run the model in: the
    picked precision's compute dtype."""
    return chosen(args).compute or torch.float32


__all__ = ["PrecisionKind", "DEFAULT", "user_choices", "kind", "flag_for", "kinds_with", "all_flags", "conflict", "given_flag",
           "chosen", "run_dtypes", "build_precision", "inference_dtype"]
