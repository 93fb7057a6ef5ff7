"""One small registry used for every kind of component.

fairseq had three registry implementations that disagreed on duplicates; this
is the only one. An entry is any object (a class or a builder function) plus an
optional dataclass holding its config. Duplicate names raise; unknown names
list the choices and the nearest match.
"""
import dataclasses
import difflib
from typing import Any, Callable, Dict, List, Optional, Type

from shardtrain.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    obj: Any
    config_cls: Optional[Type] = None


class Registry:
    """Maps names to components of one kind (``task``, ``model``, ...)."""

    def __init__(self, kind: str, flag: Optional[str] = None):
        self.kind = kind
        self.flag = flag or "--" + kind.replace("_", "-")
        self._entries: Dict[str, Entry] = {}

    def register(self, name: str, dataclass: Optional[Type] = None) -> Callable:
        """Decorator: ``@REGISTRY.register("name", dataclass=Cfg)``."""
        if dataclass is not None and not dataclasses.is_dataclass(dataclass):
            raise TypeError(f"{self.kind} {name!r}: dataclass= must be a dataclass, got {dataclass!r}")

        def decorator(obj):
            self.add(name, obj, dataclass)
            return obj

        return decorator

    def add(self, name: str, obj: Any, config_cls: Optional[Type] = None) -> None:
        if name in self._entries:
            raise ConfigError(
                f"Cannot register {self.kind} {name!r}: the name is already taken by "
                f"{_describe(self._entries[name].obj)}. Pick a different name for {_describe(obj)}."
            )
        self._entries[name] = Entry(name, obj, config_cls)

    def get(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise ConfigError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        choices = sorted(self._entries)
        hint = did_you_mean(name, choices)
        return (
            f"Unknown {self.kind} {name!r} given to {self.flag}.{hint} "
            f"Choices: {', '.join(choices) or '(none registered)'}. "
            f"A custom {self.kind} must be registered by a module loaded with --user-dir."
        )

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def names(self) -> List[str]:
        return sorted(self._entries)

    def entries(self) -> List[Entry]:
        """Every entry, in registration order (aliases included)."""
        return list(self._entries.values())


def _describe(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def did_you_mean(name: str, choices: List[str]) -> str:
    """`` Did you mean 'x'?`` for the nearest of ``choices``, or nothing: every refusal of a name says it alike."""
    near = difflib.get_close_matches(str(name), choices, n=1)
    return f" Did you mean {near[0]!r}?" if near else ""
