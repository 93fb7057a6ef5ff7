"""Refuse a YAML config whose aliases expand it past any real config's size, before it is loaded.

YAML aliases (``&a`` / ``*a``) share one node; OmegaConf copies it at every use,
so ten levels of ten aliases (a "billion laughs" file of a few hundred bytes)
become 10^10 values, and composing one took from 22 s (10^5) to minutes before
any check could run. Here the file is only parsed into its node graph (aliases
still shared) and the values it would expand to are counted with one visit per
distinct node: linear in the file's size whatever it expands to. The primary
config (--config-name) is checked; files its defaults list pulls in are not.
"""
from typing import Dict, List

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
