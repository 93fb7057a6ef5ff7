"""Refuse a YAML config whose aliases expand it past any real config's size, before it is loaded.

YAML aliases (``&a`` / ``*a``) share one node; OmegaConf copies it at every use,
so ten levels of ten aliases (a "billion laughs" file of a few hundred bytes)
become 10^10 values, and composing one took from 22 s (10^5) to minutes before
any check could run. Here the file is only parsed into its node graph (aliases
still shared) and the values it would expand to are counted with one visit per
distinct node: linear in the file's size whatever it expands to. Every file of
the config dir that composing could load is checked: the primary config, the
files the defaults lists name (followed recursively, each file checked before it
is read) and the GROUP=OPTION overrides (reachable_yaml_files). Hydra resolves
its defaults tree only while loading the files, so which files it reaches is
worked out here from the same rules; a file this misses is only left unchecked.
"""
import os
from typing import Dict, Iterator, List, Optional

import yaml

from shardtrain.core.errors import ConfigError

MAX_VALUES = 100_000  # shardtrain's whole config has a few hundred; a sweep file a few thousand


def expanded_values(node, seen: Dict[int, int]) -> int:
    """Scalars ``node`` holds once every alias is expanded (``seen``: the count per node already visited)."""
    if id(node) in seen:
        return seen[id(node)]
    if isinstance(node, yaml.ScalarNode):
        count = 1
    elif isinstance(node, yaml.SequenceNode):
        count = sum(expanded_values(child, seen) for child in node.value)
    else:  # a mapping: its keys and values
        count = sum(expanded_values(k, seen) + expanded_values(v, seen) for k, v in node.value)
    seen[id(node)] = count
    return count


def check_yaml_files(paths: List[str]) -> None:
    """Refuse any of ``paths`` that would expand to more than MAX_VALUES values."""
    for path in paths:
        try:
            with open(path, "rb") as f:
                root = yaml.compose(f, Loader=yaml.SafeLoader)
        except (OSError, yaml.YAMLError):
            continue  # unreadable or malformed: composing reports it in its own words
        count = expanded_values(root, {}) if root is not None else 0
        if count > MAX_VALUES:
            raise ConfigError(
                f"{path} expands to {count:,} values through its YAML aliases (&name / *name), more than any "
                f"config needs (at most {MAX_VALUES:,}); loading it would take minutes and all the memory. "
                "Write the values out, or remove the aliases that nest other aliases.")


def check_config_tree(config_dir: str, primary: Optional[str], overrides: List[str]) -> None:
    """Refuse any file composing ``primary`` (a path, or None: shardtrain's base) with ``overrides`` could
    load from ``config_dir`` that would expand to more than MAX_VALUES values."""
    todo = ([primary] if primary else []) + [os.path.join(config_dir, name + ".yaml")
                                             for name in _override_options(overrides)]
    checked = set()
    while todo:
        path = os.path.normpath(todo.pop())
        if path in checked or not os.path.isfile(path):
            continue
        checked.add(path)
        check_yaml_files([path])
        todo.extend(os.path.join(config_dir, name + ".yaml")
                    for name in _defaults_of(path, os.path.relpath(os.path.dirname(path), config_dir)))


def _override_options(overrides: List[str]) -> Iterator[str]:
    """GROUP/OPTION for every override that selects a config group option (model=foo, +db=[a,b])."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key and "." not in key:
            yield from _options(key.split("@")[0], value)


def _defaults_of(path: str, group: str) -> Iterator[str]:
    """GROUP/OPTION for every entry of the (already bounded) file's defaults list, relative to ``group``
    (the folder of the file) unless absolute, as Hydra reads them."""
    try:
        with open(path, "rb") as f:
            defaults = (yaml.safe_load(f) or {}).get("defaults") or []
    except (OSError, yaml.YAMLError, AttributeError):
        return  # malformed: composing reports it in its own words
    for entry in defaults if isinstance(defaults, list) else []:
        items = entry.items() if isinstance(entry, dict) else [(None, entry)]
        for key, value in items:
            if key is None:  # a config of the file's own group: "name" or "/abs/name"
                if isinstance(value, str) and value != "_self_":
                    yield _relative(group, value)
                continue
            key = str(key).split()[-1].split("@")[0]  # "override model@pkg" -> model
            yield from _options(_relative(group, key), value)


def _options(group: str, value) -> Iterator[str]:
    values = value if isinstance(value, list) else str(value).strip("[]").split(",")
    for option in values:
        if isinstance(option, str) and option.strip() and option.strip() not in ("null", "???"):
            yield f"{group}/{option.strip()}"


def _relative(group: str, name: str) -> str:
    return name.lstrip("/") if name.startswith("/") or group in ("", ".") else f"{group}/{name}"
