"""``field()``: a dataclass field with the help text the flag generator needs.

Every config field carries help text; ``choices`` restricts string values;
``positional`` makes the flag a positional argument (the data directory).
"""
import dataclasses
from typing import Any, Optional, Sequence


def field(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    choices: Optional[Sequence[str]] = None,
    default_factory: Any = dataclasses.MISSING,
    positional: bool = False,
):
    metadata = {"help": help, "choices": list(choices) if choices else None, "positional": positional}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)
