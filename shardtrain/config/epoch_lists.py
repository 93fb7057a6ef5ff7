"""``--lr`` and ``--update-freq`` as fairseq has them: one value per epoch.

fairseq 0.12 types both as lists (``--lr 0.001,0.0005``, ``--update-freq 4,2``):
epoch ``e`` (counted from 1) accumulates ``update_freq[e - 1]`` batches, or the
last value once the list runs out; the ``fixed`` schedule takes ``lr[e - 1]``
the same way and every other schedule needs a single ``--lr``. A single number
stays valid everywhere (a flag, a YAML file, a Hydra override, an older
checkpoint's config): :func:`normalize` turns either form into the one typed
representation, a list, when the config is built.
"""
import math
from typing import Any, List

from shardtrain.core.errors import ConfigError

# (field of OptimizationConfig, its flag, element type)
EPOCH_LISTS = (("lr", "--lr", float), ("update_freq", "--update-freq", int))


def parse_list(text: str, element: type) -> List:
    """``"0.001,0.0005"`` -> ``[0.001, 0.0005]`` (argparse's type for the two flags)."""
    import argparse

    try:
        return [_element(part, element) for part in str(text).split(",")]
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected a {element.__name__} or comma-separated {element.__name__}s such as 4,2, got {text!r}") from None


def _element(value: Any, element: type):
    if element is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool):
        raise ValueError(value)
    return element(value.strip() if isinstance(value, str) else value)


def as_list(value: Any, name: str, flag: str, element: type) -> List:
    """One number or a sequence of numbers (also a comma-separated string) -> a non-empty list."""
    if isinstance(value, str):
        items = value.split(",")
    else:
        items = value if hasattr(value, "__iter__") else [value]  # a list, a tuple, OmegaConf's ListConfig
    try:
        out = [_element(v, element) for v in items]
    except (TypeError, ValueError):
        out = []
    if not out:
        raise ConfigError(f"optimization.{name} ({flag}) is {value!r}, not a {element.__name__.capitalize()} or a "
                          f"list of them. Give one number or one per epoch, e.g. {flag} {_example(element)} "
                          f"(optimization.{name}=[{_example(element)}] in a config).")
    return out


def _example(element: type) -> str:
    return "4,2" if element is int else "0.001,0.0005"


def normalize(optimization) -> None:
    """Rewrite ``optimization.lr``/``update_freq`` (an OmegaConf node) as lists, in place."""
    for name, flag, element in EPOCH_LISTS:
        setattr(optimization, name, as_list(getattr(optimization, name), name, flag, element))


def for_epoch(values: Any, epoch: int):
    """The value of epoch ``epoch`` (from 1): ``values[epoch - 1]``, or the last one; a number is itself."""
    if not hasattr(values, "__getitem__"):
        return values
    return values[min(max(epoch, 1), len(values)) - 1]


def first(values: Any):
    return for_epoch(values, 1)


def numbers(values: Any) -> List:
    """A list of the numbers in ``values`` (a number is a list of one)."""
    return list(values) if hasattr(values, "__iter__") and not isinstance(values, str) else [values]


def all_finite_not_negative(values: Any) -> bool:
    return all(0 <= v < math.inf for v in numbers(values))
