"""Switching a component on the command line: ``optimizer=adafactor`` on a config file written for adam.

A config file's group section (``optimizer: {adam_betas: ..., weight_decay: ...}``) is written for the
option its defaults list chooses. When an override chooses another option, the keys that only the old
option has go with it, as a Hydra config group's options do; a key the new option has too keeps the
file's value. A key neither option has stays, so composing still names it as unknown. A delete override
(``~optimizer.adam_betas``) of a key the file sets gives the key its default back: the nodes are
dataclasses, which cannot lose a field. Hydra composes the file from the ConfigStore with those keys
removed; the file itself is not touched.
"""
import copy
import dataclasses
import os
from typing import Callable, List, Sequence, Set

from omegaconf import DictConfig, OmegaConf

from shardtrain.config.sections import COMPONENT_SLOTS
from shardtrain.core.errors import ConfigError

STORED = "_shardtrain_primary"  # the primary config as composed, in Hydra's ConfigStore
GROUPS = tuple(COMPONENT_SLOTS)


@dataclasses.dataclass
class Primary:
    name: str  # the config to compose: the file's own name, or STORED
    overrides: List[str]  # the overrides left for Hydra (the deletes handled here are gone)
    dropped: Set[str]  # full keys of the file that went with the old option, or were deleted
    notes: List[str]  # what was dropped, for the user


def prepare(config_dir: str, config_name: str, parsed: Sequence, compose_once: Callable,
            keys_of: Callable[[str, str], List[str]], store) -> Primary:
    """``parsed``: Hydra's parsed overrides; ``compose_once(name, overrides)`` -> (config, choices);
    ``keys_of(group, option)``: the option's keys; ``store``: Hydra's ConfigStore. A delete of a key
    the file does not set is left out too (the key has its default already); its name is still checked."""
    path = os.path.join(config_dir, config_name + ".yaml")
    raw = _load(path) if os.path.isfile(path) else None
    deletes = [o for o in parsed if o.is_delete() and "." in o.key_or_group and not o.package]
    chosen = [o for o in parsed if o.key_or_group in GROUPS and not o.is_delete()]
    kept_lines = [o.input_line for o in parsed if o not in deletes]
    if raw is None:  # shardtrain's base config sets no value, so deleting one changes nothing
        return Primary(config_name, kept_lines, set(), [])
    groups = {g: raw[g] for g in GROUPS if isinstance(raw.get(g), DictConfig)}
    if not deletes and not any(o.key_or_group in groups for o in chosen):
        return Primary(config_name, kept_lines, set(), [])
    dropped, notes = set(), []
    if any(o.key_or_group in groups for o in chosen):
        stripped = copy.deepcopy(raw)
        for group in groups:
            del stripped[group]
        store.store(name=STORED, node=stripped)  # the choices alone: the values depend on them
        _, own = compose_once(STORED, [])
        _, new = compose_once(STORED, [o.input_line for o in chosen])
        for group in (g for g in groups if own[g] != new[g]):
            old, kept = set(keys_of(group, own[group])), set(keys_of(group, new[group]))
            gone = [key for key in groups[group] if key in old and key not in kept]
            for key in gone:
                del groups[group][key]
            dropped |= {f"{group}.{key}" for key in gone}
            if gone:
                notes.append(_note(group, own[group], new[group], gone, sorted(set(groups[group]) & kept)))
    for o in deletes:
        section, _, key = o.key_or_group.partition(".")
        if isinstance(raw.get(section), DictConfig) and key in raw[section]:
            del raw[section][key]
            dropped.add(o.key_or_group)
    store.store(name=STORED, node=raw)
    return Primary(STORED, kept_lines, dropped, notes)


def _load(path: str) -> DictConfig:
    try:
        raw = OmegaConf.load(path)
    except Exception as e:  # noqa: BLE001 - YAML and OmegaConf raise many types for a bad file
        raise ConfigError(f"Cannot read {path}: {' '.join(str(e).split())}. Fix the YAML syntax.") from None
    return raw if isinstance(raw, DictConfig) else None  # not a mapping: composing reports it


def _note(group: str, old: str, new: str, gone: List[str], kept: List[str]) -> str:
    keys = ", ".join(f"{group}.{key}" for key in gone)
    text = f"{group}={new} replaces the config's {old}: {keys} ({old}'s, which {new} lacks) went with it"
    return text + (f"; kept: {', '.join(f'{group}.{key}' for key in kept)}" if kept else "")
