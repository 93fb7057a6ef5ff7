"""``field()``: a dataclass field with the help text the flag generator needs.

Every config field carries help text; ``choices`` restricts string values
(a zero-argument callable is called when the parser is built, for choices a
registry holds: plugins register theirs before that);
``positional`` makes the flag a positional argument (the data directory);
``aliases`` are further flag names for it (fairseq's, e.g. ``--max-sentences`` for ``--batch-size``).
"""
import dataclasses
from typing import Any, Callable, Sequence, Union


def field(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    choices: Union[Sequence[str], Callable[[], Sequence[str]], None] = None,
    default_factory: Any = dataclasses.MISSING,
    positional: bool = False,
    aliases: Sequence[str] = (),
):
    if choices and not callable(choices):
        choices = list(choices)
    metadata = {"help": help, "choices": choices or None, "positional": positional, "aliases": tuple(aliases)}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)
