"""The config as a run's log shows it: the chosen components and what differs from their defaults.

The whole resolved config (~130 lines) goes to ``<save_dir>/config.yaml``; the log keeps the lines a
reader looks for, in the order of the sections.
"""
import textwrap
from typing import Dict

from omegaconf import DictConfig

from shardtrain.config.run_config import from_dict, to_dict

WIDTH = 110  # characters per line of settings
_MISSING = object()


def changed_settings(cfg: DictConfig) -> Dict[str, object]:
    """``section.key`` -> value for every value that differs from the defaults of the same components
    (the architecture's preset included), in the config's order."""
    values = to_dict(cfg)
    defaults = _flat(to_dict(from_dict({"components": values["components"]})))
    return {key: value for key, value in _flat(values).items()
            if not key.startswith("components.") and defaults.get(key, _MISSING) != value}


def config_summary(cfg: DictConfig, full_config_path: str) -> str:
    names = " ".join(f"{k}={v}" for k, v in to_dict(cfg)["components"].items())
    settings = ", ".join(f"{key}={value}" for key, value in changed_settings(cfg).items()) or "(none)"
    return "\n".join([f"components: {names}",
                      textwrap.fill(settings, WIDTH, initial_indent="settings (not the defaults): ",
                                    subsequent_indent="    ", break_long_words=False, break_on_hyphens=False),
                      f"full config: {full_config_path} (written with the first checkpoint)"])


def _flat(values: Dict, prefix: str = "") -> Dict[str, object]:
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
