"""Where shard-hydra-train reads its config files: ``--config-dir``, the working directory, the built-in recipes.

Its own file because finding and checking the files is done before Hydra is involved and needs none of it
(``hydra_store.py`` fills Hydra's ConfigStore and composes): which directory a ``--config-name`` is read
from, the built-in recipes shipped inside the package (so ``--config-name lm_fully_sharded`` works from a
wheel install), and the checks that name the fix when a directory or file is missing or a file would hide
the base config.
"""
import difflib
import os
from typing import List, Optional

from shardtrain.core.errors import ConfigError

BASE_CONFIG = "shardtrain"
# The example configs ship inside the package, so `--config-name lm_fully_sharded` works from a wheel install.
RECIPES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes")


def builtin_config_names() -> List[str]:
    return sorted(f[:-len(".yaml")] for f in os.listdir(RECIPES_DIR) if f.endswith(".yaml"))


def _bare_name(config_name: str) -> str:
    return config_name[:-len(".yaml")] if config_name.endswith(".yaml") else config_name


def config_dir_for(config_dir: Optional[str], config_name: Optional[str]) -> str:
    """The directory configs are read from: ``--config-dir``, else the working directory, else (for a
    ``--config-name`` the working directory lacks) shardtrain's built-in configs."""
    if config_dir is not None:
        return os.path.abspath(config_dir)
    cwd = os.path.abspath(os.curdir)
    if config_name is not None:
        name = _bare_name(config_name)
        if not os.path.isfile(os.path.join(cwd, name + ".yaml")) and name in builtin_config_names():
            return RECIPES_DIR
    return cwd


def config_path(config_dir: str, config_name: str) -> str:
    """The primary config file, checked before Hydra sees it (for a message with the fix)."""
    name = _bare_name(config_name)
    check_config_dir(config_dir)
    path = os.path.join(config_dir, name + ".yaml")
    if not os.path.isfile(path):
        names = sorted(f[:-5] for f in os.listdir(config_dir) if f.endswith(".yaml"))
        builtin = builtin_config_names()
        near = difflib.get_close_matches(name, names + builtin, n=1)
        hint = f" Did you mean '{near[0]}'?" if near else ""
        raise ConfigError(f"--config-name {name}: there is no {path}.{hint} Configs in {config_dir}: "
                          f"{', '.join(names) or '(none)'}; built into shardtrain (used when --config-dir is not "
                          f"given): {', '.join(builtin)}. Pass one of them, or another --config-dir.")
    return path


def check_config_dir(config_dir: str) -> None:
    if not os.path.isdir(config_dir):
        raise ConfigError(f"--config-dir {config_dir} does not exist or is not a directory. Pass the directory "
                          "that holds your YAML configs (e.g. --config-dir examples/configs).")


def check_base_not_hidden(config_dir: str) -> None:
    """A file named like the base config comes first on Hydra's search path and would replace it."""
    path = os.path.join(config_dir, BASE_CONFIG + ".yaml")
    if os.path.exists(path):
        raise ConfigError(f"{path} has the name of shardtrain's base config ({BASE_CONFIG}) and would hide it. "
                          "Rename the file (and --config-name).")
