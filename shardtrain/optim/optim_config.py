"""What the optimizers share of their flags: parsing tuples and betas, the non-negative checks, and the Adam
flags (``AdamConfig``) that ``adam`` (optimizers.py) and ``cpu_adam`` (cpu_adam.py) both extend. A module of its
own so that neither optimizer's module imports the other's (optimizers.py builds ``CPUAdam`` for
``--fp16-adam-stats``)."""
import ast
import dataclasses
from typing import Any, Tuple

from shardtrain.core.errors import ConfigError
from shardtrain.core.fields import field


def parse_float_tuple(value: Any, flag: str, example: Tuple[float, ...]) -> Tuple[float, ...]:
    """A tuple of ``len(example)`` floats from a tuple/list (what the CLI and OmegaConf
    give) or from a string such as ``"(0.9, 0.98)"`` (a hand-written config)."""
    original = value
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            value = None
    try:
        parsed = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        parsed = ()
    if len(parsed) != len(example):
        raise ConfigError(
            f"{flag} must be {len(example)} numbers, got {original!r}. "
            f"Write it as a tuple, e.g. {flag} '{example}'."
        )
    return parsed


def parse_betas(value: Any, flag: str) -> Tuple[float, float]:
    betas = parse_float_tuple(value, flag, (0.9, 0.999))
    if not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(f"{flag} {betas} is out of range: each beta must be in [0, 1). "
                          f"Use e.g. {flag} '(0.9, 0.98)'.")
    return betas


def check_non_negative(cfg, *names: str) -> None:
    # torch would raise a bare ValueError at build time; say which flag is wrong instead.
    for name in names:
        value = getattr(cfg, name)
        if not 0 <= value < float("inf"):  # NaN fails too
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} is {value}, but it must be a finite number >= 0. Pass a non-negative {flag}.")


@dataclasses.dataclass
class AdamConfig:
    adam_betas: Tuple[float, float] = field((0.9, 0.999), help="betas for Adam optimizer")
    adam_eps: float = field(1e-8, help="epsilon for Adam optimizer")
    weight_decay: float = field(0.0, help="weight decay")
    adamw_mode: bool = field(
        True, help="decoupled weight decay as in fairseq's adam (torch.optim.AdamW); "
        "--no-adamw-mode adds weight decay to the gradient as L2 (torch.optim.Adam)")
