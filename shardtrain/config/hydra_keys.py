"""Messages in shard-hydra-train's words: ``--warmup-updates 4000`` becomes ``lr_scheduler.warmup_updates=4000``.

Every check and error names flags, written once for shard-train. A shard-hydra-train user writes keys, so
its entry point rewrites the flags in any error it reports (the ranks' included, which come back through
the launcher) with the table of every flag and its key, built from the same dataclasses both front ends are
generated from. A flag that is not ours (a fairseq flag, a typo) is left as written.
"""
import dataclasses
import functools
import re
import typing
from typing import Dict, Iterable, Tuple

from shardtrain.config import components
from shardtrain.config.hydra_store import option_names
from shardtrain.config.sections import COMPONENT_SLOTS, SECTIONS

_FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*(?![\w-])")
# A flag's value as messages write it: a number (or a comma-separated list), or a placeholder such as N.
_NUMBER = re.compile(r" (-?[\d.]+(?:e-?\d+)?(?:,-?[\d.]+(?:e-?\d+)?)*|[A-Z][A-Z_]*)(?![\w-])")
_WORD = re.compile(r" ([A-Za-z_][\w.]*)")
_BOOL = re.compile(r" (True|False)(?![\w-])")  # a switch's value, as a message writes a config's (hf_start)


def as_keys(message: str, keep: Iterable[str] = ()) -> str:
    """``message`` with every flag of ours (and its number, or its component's name) written as a key;
    the flags in ``keep`` (the command's own options, e.g. shard-hydra-train's --user-dir) stay."""
    table = flag_table()
    out, pos = [], 0
    for match in _FLAG.finditer(message):
        entry = None if match.group() in keep else table.get(match.group())
        if entry is None:
            continue
        key, kind = entry
        out.append(message[pos:match.start()])
        pos = match.end()
        value = (_BOOL if kind == "bool" else _WORD if kind == "group" else _NUMBER).match(message, pos)
        if kind == "bool":
            out.append(f"{key}={value.group(1).lower() if value else 'true'}")
            pos = value.end() if value else pos
        elif value is not None and (kind != "group" or value.group(1) in option_names(key)):
            out.append(f"{key}={value.group(1)}")
            pos = value.end()
        else:
            out.append(key)
    return "".join(out) + message[pos:]


@functools.lru_cache(maxsize=None)
def flag_table() -> Dict[str, Tuple[str, str]]:
    """``--flag`` -> (key, kind): kind "group" for a component choice (``--arch`` -> ``model``), "bool" for
    a flag that takes no value, "value" otherwise. Components registered later (plugins) are read when the
    table is first used, which is after they registered."""
    table = {f"--{field.replace('_', '-')}": (group, "group") for group, field in COMPONENT_SLOTS.items()}
    for section, cls in SECTIONS.items():
        if section != "components":
            _add_fields(table, section, cls)
    for group in COMPONENT_SLOTS:
        for cls in _config_classes(group):
            _add_fields(table, group, cls)
    return table


def _add_fields(table, prefix: str, cls) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or f.metadata.get("positional"):
            continue
        kind = "bool" if hints[f.name] is bool else "value"
        for flag in (f"--{f.name.replace('_', '-')}", *f.metadata.get("aliases", ())):
            table.setdefault(flag, (f"{prefix}.{f.name}", kind))


def _config_classes(group: str):
    regs = components.registries()[group]
    registry = regs[0] if group == "model" else regs
    return [registry.get(name).config_cls for name in registry.names() if registry.get(name).config_cls]
