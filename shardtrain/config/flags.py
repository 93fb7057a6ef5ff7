"""Generate argparse flags from config dataclasses, and parse them back.

Dataclasses are the single source of truth: each field becomes ``--field-name``
with the field's type, default, choices and help. Parsing happens in two
stages, as in fairseq: the first reads only ``--user-dir`` and the component
names (so plugins are imported and the selected components are known), the
second builds the full parser with just the selected components' flags.
"""
import argparse
import ast
import dataclasses
import difflib
import re
import typing
from typing import Any, Dict, Iterable, List, Optional, Sequence

from shardtrain.config import epoch_lists
from shardtrain.core.errors import ConfigError

_NAME_FLAGS = {
    "--task": "task", "--arch": "arch", "--criterion": "criterion",
    "--optimizer": "optimizer", "--lr-scheduler": "lr_scheduler",
}


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def parse_tuple(text: str) -> tuple:
    """``"(0.9, 0.98)"``, ``"0.9,0.98"`` or ``"[0.9, 0.98]"`` -> ``(0.9, 0.98)``."""
    try:
        value = ast.literal_eval(text if any(c in text for c in "([") else f"({text},)")
        return tuple(float(v) for v in value)
    except (ValueError, SyntaxError, TypeError):
        raise argparse.ArgumentTypeError(f"expected numbers like '(0.9, 0.98)', got {text!r}") from None


def _base_type(tp):
    """Strip Optional[...]; return (base type, is_optional)."""
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0])[0], True
    return tp, False


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


# Help that already explains its default ("(default: --max-tokens)") keeps its words.
_STATES_DEFAULT = re.compile(r"\(default\b")


def _help(f: dataclasses.Field, default: Any) -> str:
    """The field's help, always ending with its default (or that it is required).

    ``%`` is escaped because argparse %-formats help text when printing it."""
    text = f.metadata.get("help", "").replace("%", "%%")
    if _STATES_DEFAULT.search(text):
        return text
    return f"{text} {describe_default(default)}"


def describe_default(default: Any) -> str:
    if default is dataclasses.MISSING:
        return "(required)"
    if default is None:
        return "(default: not set)"
    if default == "":
        return "(default: '')"
    return f"(default: {default})".replace("%", "%%")


def add_dataclass_flags(group, section: str, cls, overrides: Optional[Dict] = None) -> None:
    """Add one flag per field of ``cls``; dest is ``"<section>.<field>"``."""
    hints = typing.get_type_hints(cls)
    overrides = overrides or {}
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        default = overrides.get(f.name, _default(f))
        tp, _ = _base_type(hints[f.name])
        kwargs = dict(dest=f"{section}.{f.name}", help=_help(f, default))
        if f.metadata.get("positional"):
            kwargs.pop("dest")
            if default is not dataclasses.MISSING:
                kwargs.update(nargs="?", default=default)
            group.add_argument(f"{section}.{f.name}", metavar=f.name.upper(), **kwargs)
            continue
        kwargs["default"] = None if default is dataclasses.MISSING else default
        if default is dataclasses.MISSING:
            kwargs["required"] = True
        if tp is bool:
            kwargs["action"] = argparse.BooleanOptionalAction if default is True else "store_true"
        elif typing.get_origin(tp) is tuple:
            kwargs.update(type=parse_tuple, metavar="TUPLE")
        elif isinstance(default, list):  # fairseq's per-epoch lists: --lr 0.001,0.0005
            element = type(default[0])
            kwargs.update(type=lambda text, element=element: epoch_lists.parse_list(text, element),
                          metavar=f.name.upper())
        else:
            kwargs["type"] = tp if tp in (int, float, str) else str
            choices = f.metadata.get("choices")
            if choices:
                kwargs["choices"] = list(choices() if callable(choices) else choices)
            else:
                kwargs["metavar"] = f.name.upper()  # not the "section.field" dest
        try:
            group.add_argument(flag_name(f.name), *f.metadata.get("aliases", ()), **kwargs)
        except argparse.ArgumentError as e:
            raise ConfigError(
                f"{cls.__qualname__}.{f.name} defines {flag_name(f.name)}, which another config section "
                f"already defines ({e}). Rename the field in one of the two components."
            ) from None


def section_values(namespace: argparse.Namespace, section: str) -> Dict[str, Any]:
    prefix = section + "."
    return {k[len(prefix):]: v for k, v in vars(namespace).items() if k.startswith(prefix)}


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose "unrecognized arguments" error names the nearest known flags."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments: "):  # one paragraph: the usage would not help
            self.exit(2, f"{self.prog}: error: {unrecognized_message(message, self._visible_flags(), self.prog)}\n")
        super().error(message)

    def _visible_flags(self) -> List[str]:
        return [name for action in self._actions if action.help != argparse.SUPPRESS
                for name in action.option_strings]


def unrecognized_message(message: str, known: Sequence[str], prog: str) -> str:
    """argparse's ``unrecognized arguments: ...`` with, per mistyped flag, the nearest of ``known``."""
    hints = []
    for token in message[len("unrecognized arguments: "):].split():
        name = token.split("=", 1)[0]
        if not name.startswith("-"):
            continue
        near = difflib.get_close_matches(name, known, n=2, cutoff=0.7)
        if near:
            hints.append(f"{name}: did you mean {' or '.join(near)}?")
    advice = f" ({prog} --help lists the flags)" if prog else ""
    return f"{message}. {' '.join(hints) + ' ' if hints else ''}Remove or correct the flag{advice}."


def new_parser(prog: str, description: str, add_help: bool = True,
               usage: Optional[str] = None) -> argparse.ArgumentParser:
    return Parser(
        prog=prog, description=description, add_help=add_help, allow_abbrev=False, usage=usage,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def short_usage(prog: str, sections: Iterable, width: int = 79) -> str:
    """``PROG [-h] [--task TASK] ... [FLAGS ...] DATA``, wrapped under PROG.

    argparse's own usage line lists every flag (80 lines for shard-train) before
    the groups that explain them; this one names the component flags, the
    required flags and the positionals, and leaves the rest to the groups."""
    parts = ["[-h]"] + [f"[{flag} {name.upper()}]" for flag, name in _NAME_FLAGS.items()]
    parts.append("[FLAGS ...]")
    positionals = []
    for _, cls, overrides in sections:
        for f in dataclasses.fields(cls):
            default = (overrides or {}).get(f.name, _default(f))
            if f.metadata.get("positional"):
                metavar = f.name.upper()
                positionals.append(metavar if default is dataclasses.MISSING else f"[{metavar}]")
            elif default is dataclasses.MISSING:
                parts.append(f"{flag_name(f.name)} {f.name.upper()}")
    # argparse prints a given usage unwrapped; wrap it the way it wraps its own.
    lines = [f"usage: {prog}"]
    indent = " " * len(lines[0])
    for part in parts + positionals:
        if len(lines[-1]) + 1 + len(part) > width:
            lines.append(indent)
        lines[-1] += " " + part
    return "\n".join(lines)[len("usage: "):].replace("%", "%%")  # argparse adds "usage: " itself


def preparse(argv: Sequence[str], defaults) -> argparse.Namespace:
    """Stage one: ``--user-dir`` and the component names only."""
    parser = new_parser("", "", add_help=False)
    parser.add_argument("--user-dir", default=None)
    for flag, name in _NAME_FLAGS.items():
        parser.add_argument(flag, dest=name, default=getattr(defaults, name))
    known, _ = parser.parse_known_args(list(argv))
    return known


def add_sections(parser, sections: Iterable, titles: Optional[Dict[str, str]] = None) -> None:
    """``sections``: (section name, dataclass, overrides) triples, one flag group each."""
    titles = titles or {}
    for section, cls, overrides in sections:
        group = parser.add_argument_group(titles.get(section, section))
        add_dataclass_flags(group, section, cls, overrides)


def parse_dataclass(cls, argv: Sequence[str], prog: str, description: str, title: Optional[str] = None):
    """A whole command line that is one config dataclass (shard-validate, -generate, ...).

    Without ``title`` the flags join argparse's own groups (positional
    arguments, options) rather than a second group also called "options"."""
    parser = new_parser(prog, description)
    if title is None:
        add_dataclass_flags(parser, "args", cls)
    else:
        add_sections(parser, [("args", cls, None)], {"args": title})
    return cls(**section_values(parser.parse_args(list(argv)), "args"))
