"""Hydra's ConfigStore, filled from the registries, and composition with our errors.

The store is filled at CLI start-up, after plugins are imported, never at
import time: it must list what plugins register. What it holds:

* ``shardtrain``: the base config. The framework sections (common, dataset,
  optimization, checkpoint, distributed) as typed nodes, and a defaults list
  that picks shard-train's default task/model/criterion/optimizer/lr_scheduler.
* groups ``task``, ``model``, ``criterion``, ``optimizer``, ``lr_scheduler``:
  one option per registered name, holding that component's config dataclass;
  ``model`` has one option per architecture, holding the architecture's preset.

The dataclasses are the ones the flags are generated from, so a run written as
flags and as a Hydra config resolves to the same typed config (both go through
``build.from_dict``). Which directory and file a config is read from: ``hydra_files.py``.
"""
import dataclasses
import difflib
import re
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from shardtrain.config import components, hf_start, hydra_switch, override_wins
from shardtrain.config.hydra_files import BASE_CONFIG
from shardtrain.config.sections import COMPONENT_SLOTS, SECTIONS, ComponentsConfig
from shardtrain.core.errors import ConfigError

if TYPE_CHECKING:
    from shardtrain.models.hf_config import HfModelConfig

GROUPS = tuple(COMPONENT_SLOTS)  # task, model, criterion, optimizer, lr_scheduler
FRAMEWORK_SECTIONS = tuple(s for s in SECTIONS if s != "components")  # chosen by the groups instead
_KINDS = {"model": "model architecture", "lr_scheduler": "lr scheduler"}
_KEY_FIX = ("Keys are shard-train's flag names with '_' for '-', under the section or component that owns "
            "them; print the whole config with --cfg job.")


def option_names(group: str) -> List[str]:
    regs = components.registries()[group]
    return (regs[1] if group == "model" else regs).names()  # model: one option per architecture


def option_node(group: str, name: str, hf: Optional["HfModelConfig"] = None):
    """The config node of one group option: the component's dataclass (plus the arch preset; for a run from
    the Hugging Face folder ``hf``, an architecture of its family holds the folder's values over that).
    Built once per registration (see ``_built``); callers copy it before changing it."""
    info = components.resolve(ComponentsConfig(**{COMPONENT_SLOTS[group]: name}))[group]
    from_folder = hf is not None and group == "model" and hf_start.family_of(name) == hf.model
    preset = hf_start.model_preset(hf, info.preset) if from_folder else info.preset
    made_from = (info.obj, info.config_cls, repr(preset))
    built = _built.get((group, name, from_folder))
    if built is not None and built[0] == made_from:
        return built[1]
    if info.config_cls is None:
        node = OmegaConf.create({})
    else:
        if group == "model":
            components.check_preset(name, info.config_cls, preset)
        node = OmegaConf.merge(OmegaConf.structured(info.config_cls), preset)
    _built[(group, name, from_folder)] = (made_from, node)
    return node


# Building a node (OmegaConf.structured and merge deep-copy every field) and storing it (Hydra
# copies it again) cost ~0.9 s for the ~60 registered options, on every compose: most of what a
# Hydra run or test spends outside Hydra itself. So each option is built once per registration
# (the registered object, its config class and preset: a plugin registering again makes a new one)
# and stored again only when the store no longer holds what was last stored for it.
_built: Dict[Tuple[str, str, bool], Tuple[tuple, DictConfig]] = {}  # (group, name, from a folder) -> (made from, node)
_stored: Dict[Tuple[str, str], Tuple[DictConfig, object]] = {}  # (group, name) -> (node, Hydra's ConfigNode)


def _store(store: ConfigStore, group: str, name: str, node: DictConfig) -> None:
    last = _stored.get((group, name))
    if last is not None and last[0] is node and store.repo.get(group, {}).get(f"{name}.yaml") is last[1]:
        return
    store.store(group=group, name=name, node=node)
    _stored[(group, name)] = (node, store.repo[group][f"{name}.yaml"])


def fill_config_store(store: ConfigStore, hf: Optional["HfModelConfig"] = None) -> None:
    """``store``: ``ConfigStore.instance()`` (Hydra's, process-wide). Storing a
    name again replaces it, so calling this twice in a process is harmless. ``hf``: the Hugging Face
    folder's config the run starts from (hf_start): the model group then defaults to the folder's family,
    whose options hold the folder's values, so a composed model value that differs was set by the user."""
    defaults = ComponentsConfig(**({"arch": hf.model} if hf is not None else {}))
    base = {"defaults": ["_self_"] + [{g: getattr(defaults, COMPONENT_SLOTS[g])} for g in GROUPS]}
    base.update({name: SECTIONS[name] for name in FRAMEWORK_SECTIONS})
    store.store(name=BASE_CONFIG, node=base)
    for group in GROUPS:
        for name in option_names(group):
            _store(store, group, name, option_node(group, name, hf))


def check_option(group: str, name, where: str) -> None:
    if isinstance(name, str) and name in option_names(group):
        return
    kind = _KINDS.get(group, group)
    near = difflib.get_close_matches(str(name), option_names(group), n=1)
    hint = f" Did you mean '{near[0]}'?" if near else ""
    raise ConfigError(
        f"Unknown {kind} {name!r} {where}.{hint} Choices for {group}: {', '.join(option_names(group))}. "
        f"A custom {kind} must be registered by a plugin: pass --user-dir PATH or common.user_dir=PATH.")


def schema_keys(choices: Dict[str, str]) -> Dict[str, List[str]]:
    """Allowed keys: ``""`` -> the top-level names; each section/group -> its fields."""
    keys = {"": list(FRAMEWORK_SECTIONS) + list(GROUPS)}
    for name in FRAMEWORK_SECTIONS:
        keys[name] = list(OmegaConf.structured(SECTIONS[name]).keys())
    for group in GROUPS:
        keys[group] = list(OmegaConf.create(option_node(group, choices[group])).keys())
    return keys


def unknown_key(key: str, schema: Dict[str, List[str]]) -> Optional[str]:
    """The first part of the dotted ``key`` that the schema does not know, as a dotted path."""
    parts = key.split(".")
    if parts[0] not in schema[""]:
        return parts[0]
    if len(parts) > 1 and parts[1] not in schema[parts[0]]:
        return ".".join(parts[:2])
    return None


def unknown_key_message(key: str, valid: Sequence[str], where: str, owner: Optional[str] = None) -> str:
    """``valid``: the keys next to ``key``'s last part; ``owner`` names their node."""
    parent, _, leaf = key.rpartition(".")
    near = difflib.get_close_matches(leaf, valid, n=1)
    hint = f" Did you mean '{parent + '.' if parent else ''}{near[0]}'?" if near else ""
    scope = f"Keys of {owner or parent}" if parent else "Top-level keys"
    if key == "components":
        where += " (components are chosen with the groups: task=..., model=ARCH, optimizer=..., ...)"
    return f"Unknown config key '{key}' {where}.{hint} {scope}: {', '.join(valid) or '(none)'}. {_KEY_FIX}"


def _schema_message(key: str, schema: Dict[str, List[str]], where: str, choices: Dict[str, str]) -> str:
    parent = key.rpartition(".")[0]
    owner = f"{parent} ({choices[parent]})" if parent in GROUPS else parent
    return unknown_key_message(key, schema[parent], where, owner)


def compose(config_dir: str, config_name: str, overrides: Sequence[str], source: str,
            hf: Optional["HfModelConfig"] = None) -> Tuple[DictConfig, Dict[str, str], List[str]]:
    """Fill the store and compose ``config_name`` from ``config_dir`` (an
    absolute path) with Hydra-syntax ``overrides``; returns (config, group choices,
    notes on the file's keys that went with a component switched by an override).

    ``source`` names the primary config in messages; ``hf``: the Hugging Face folder's config the run
    starts from (see ``fill_config_store``). Hydra's global state is restored when this returns.
    """
    fill_config_store(ConfigStore.instance(), hf)
    with initialize_config_dir(config_dir=config_dir, version_base="1.3", job_name="shard-hydra-train"):
        return _compose_checked(config_dir, config_name, overrides, source)


def _compose_checked(config_dir: str, config_name: str, overrides: Sequence[str],
                     source: str) -> Tuple[DictConfig, Dict[str, str], List[str]]:
    """The group choices first (they decide which keys exist), so an unknown key in an override is
    named with the valid keys and the nearest match; then everything."""
    parsed = parse_overrides(overrides)
    choosing = [o for o in parsed if o.key_or_group in GROUPS or "/" in o.key_or_group or o.package]
    for o in choosing:
        if o.key_or_group in GROUPS and not o.is_delete():
            check_option(o.key_or_group, o.value(), f"in the override '{o.input_line}'")
    primary = hydra_switch.prepare(config_dir, config_name, parsed,
                                   lambda name, lines: _compose_once(name, lines, source),
                                   lambda group, name: list(OmegaConf.create(option_node(group, name)).keys()),
                                   ConfigStore.instance())
    _, choices = _compose_once(primary.name, [o.input_line for o in choosing], source)
    schema = schema_keys(choices)
    for o in parsed:
        handled = o.is_delete() and o.key_or_group in primary.dropped  # a key the file set, now gone
        if o not in choosing and not o.is_hydra_override() and not handled:
            bad = unknown_key(o.key_or_group, schema)
            if bad:
                raise ConfigError(_schema_message(bad, schema, f"in the override '{o.input_line}'", choices))
    cfg, choices = _compose_once(primary.name, primary.overrides, f"{source} with its overrides")
    try:
        _check_composed(cfg, schema, source, choices)
    except OmegaConfBaseException as e:  # reading a value resolves its ${...}
        raise ConfigError(f"Cannot resolve {source} with its overrides: {' '.join(str(e).split())}. Fix the "
                          "interpolation (${...}) named above.") from None
    return cfg, choices, primary.notes + override_wins.apply(cfg, parsed, source)


def parse_overrides(overrides: Sequence[str]):
    """Hydra's own parser (so values are typed as Hydra types them); sweeps refused."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as e:
        raise ConfigError(f"Cannot parse the override {getattr(e, 'override', '')!r}: {_one_paragraph(e)}. "
                          "Overrides are Hydra's key=value, e.g. optimization.lr=0.001 or "
                          "model=transformer_lm_gpt.") from None
    for o in parsed:
        if o.is_sweep_override():
            raise ConfigError(f"The override '{o.input_line}' is a sweep (several values), which needs Hydra's "
                              "multirun; shard-hydra-train trains one config per command. Give one value, or "
                              "quote a value that contains commas.")
    return parsed


def _compose_once(config_name: str, overrides: List[str], source: str) -> Tuple[DictConfig, Dict[str, str]]:
    try:
        cfg = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    except MissingConfigException as e:
        group, _, name = (e.missing_cfg_file or "").rpartition("/")
        if group in GROUPS:
            check_option(group, name, f"chosen in {source}")
        raise ConfigError(f"In {source}: {_one_paragraph(e)}.") from None
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(_composition_message(e, source)) from None
    choices = {g: cfg.hydra.runtime.choices.get(g) for g in GROUPS}
    missing = [g for g, name in choices.items() if name is None]
    if missing:
        raise ConfigError(
            f"{source} chooses no {', '.join(missing)}: it does not extend shardtrain's base config. Start its "
            f"defaults list with '- {BASE_CONFIG}' (then '- override model: ARCH' etc. and '- _self_'), as in "
            "examples/configs/*.yaml.")
    for group, name in choices.items():
        check_option(group, name, f"chosen in {source}")
    return cfg, choices


def _composition_message(error: Exception, source: str) -> str:
    """Hydra reports a bad key in a config file only in its message text (no
    exception cause to read it from), naming the dataclass that lacks it."""
    text = _one_paragraph(error)
    found = re.search(r"Key '[^']+' not in '([^']+)' full_key: (\S+)", text)
    valid = _fields_of_class_named(found.group(1)) if found else None
    if valid is not None:
        return unknown_key_message(found.group(2), valid, f"in {source}")
    return f"Cannot compose {source}: {text}. Fix the key or value named above (--cfg job prints the config)."


def _fields_of_class_named(name: str) -> Optional[List[str]]:
    classes = list(SECTIONS.values())
    for group, registry in components.registries().items():
        for reg in registry if group == "model" else (registry,):
            classes += [reg.get(n).config_cls for n in reg.names()]
    for cls in classes:
        if cls is not None and cls.__name__ == name:
            return [f.name for f in dataclasses.fields(cls)]
    return None


def _check_composed(cfg: DictConfig, schema, source: str, choices) -> None:
    """Keys a config file added at the root (the only open node), sections replaced by
    plain values, and values left at ???."""
    for key in FRAMEWORK_SECTIONS + GROUPS:
        if key in cfg and not isinstance(cfg[key], DictConfig):
            group = next((g for g, reg in components.registries().items()
                          if any(str(cfg[key]) in r for r in (reg if g == "model" else (reg,)))), None)
            hint = f" Did you mean {group}={cfg[key]}?" if group and group != key else ""
            raise ConfigError(f"'{key}' is a section of the config, but it was given the value {cfg[key]!r} "
                              f"({source} with its overrides). Set keys inside it instead ({key}.KEY=VALUE)."
                              f"{hint}")
    for key in (k for k in cfg if k != "hydra"):
        node = cfg[key]
        paths = [key] + ([f"{key}.{k}" for k in node] if isinstance(node, DictConfig) else [])
        for bad in filter(None, (unknown_key(p, schema) for p in paths)):
            raise ConfigError(_schema_message(bad, schema, f"in {source}", choices))
    # Per section (full keys): hydra's own node holds values that are ??? until a job runs.
    missing = sorted(k for key in cfg if key != "hydra" and isinstance(cfg[key], DictConfig)
                     for k in OmegaConf.missing_keys(cfg[key]))
    if missing:
        them = "it" if len(missing) == 1 else "them"
        raise ConfigError(f"{', '.join(missing)} must be set ({source} leaves {them} at ???). Set {them} in the "
                          f"config file or on the command line, e.g. {missing[0]}=VALUE.")


def _one_paragraph(error: Exception) -> str:
    """Hydra's message (and its cause's, which says what was wrong), minus the search path."""
    text = str(error).split("\nConfig search path:")[0].split("\nSearch path:")[0]
    if error.__cause__ is not None:
        text = f"{text.rstrip('.')}: {error.__cause__}"
    return " ".join(text.split()).rstrip(".")
