"""``--user-dir``: a plugin folder imported by path, and where a checkpoint says it was.

A run's config holds the plugin folder as an absolute path (:func:`with_user_dir_imported`
resolves the one given against the working directory), and a checkpoint's header records it
with the module name it was imported as (:func:`record`). A command that loads the checkpoint
imports the folder an explicit ``--user-dir`` names, else the recorded one, from any working
directory (:func:`for_checkpoint`).
"""
import importlib
import os
import sys
from typing import Dict, Optional

from shardtrain.core.errors import ConfigError

HEADER_KEY = "plugin"  # a checkpoint header's {"user_dir": absolute path, "module": name}
# --user-dir of the commands that load a checkpoint
LOADING_HELP = ("the plugin folder (a Python package) that registers the checkpoint's task, model or criterion; "
                "default: the one the checkpoint recorded")


def absolute(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def import_user_dir(path: Optional[str]) -> Optional[str]:
    """Import the plugin package at ``path`` so its components register themselves; -> its absolute path."""
    if not path:
        return None
    path = absolute(path)
    if not os.path.isdir(path):
        raise ConfigError(f"--user-dir {path} does not exist or is not a directory. "
                          "Pass the path of a Python package whose __init__.py registers your components.")
    parent, name = os.path.split(path)
    if name in sys.modules:
        if os.path.dirname(os.path.abspath(getattr(sys.modules[name], "__file__", "") or "")) == path:
            if parent not in sys.path:  # see below
                sys.path.insert(0, parent)
            return path
        raise ConfigError(f"--user-dir {path}: a module named {name!r} is already imported from elsewhere. "
                          "Rename the plugin folder so its name does not clash.")
    # The folder stays on sys.path: ranks started with multiprocessing's spawn copy the
    # launcher's sys.path, and they import the plugin again to rebuild its components.
    if parent not in sys.path:
        sys.path.insert(0, parent)
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any plugin failure is the user's to fix
        raise ConfigError(f"--user-dir {path} failed to import: {type(e).__name__}: {e}. "
                          f"Fix the error in the plugin (run `python -c 'import {name}'` from "
                          f"{parent} to see the traceback).") from e
    return path


def with_user_dir_imported(values: Dict) -> Dict:
    """Config ``values`` (a dict of sections) with ``common.user_dir`` imported and made absolute,
    so a checkpoint's config names the plugin folder wherever it is loaded from."""
    common = values.get("common") or {}
    if not common.get("user_dir"):
        return values
    return {**values, "common": {**common, "user_dir": import_user_dir(common["user_dir"])}}


def record(user_dir: Optional[str]) -> Dict:
    """The checkpoint header's entry for the run's plugin folder (empty without one)."""
    if not user_dir:
        return {}
    path = absolute(user_dir)
    return {HEADER_KEY: {"user_dir": path, "module": os.path.basename(path)}}


def for_checkpoint(explicit: Optional[str], state: Dict, checkpoint: str) -> Optional[str]:
    """The plugin folder to import before rebuilding the checkpoint ``state``'s components: ``explicit``
    (``--user-dir``) when given, else the one the checkpoint recorded; None when it used none."""
    if explicit:
        return explicit
    recorded = state.get(HEADER_KEY) or {}
    # Checkpoints written before the header recorded it hold only the config's value (perhaps relative).
    path = recorded.get("user_dir") or ((state.get("cfg") or {}).get("common") or {}).get("user_dir")
    if not path or os.path.isdir(path):
        return path
    module = recorded.get("module") or os.path.basename(os.path.normpath(path))
    where = "" if os.path.isabs(path) else f" (relative to the folder training ran in, not {os.getcwd()})"
    raise ConfigError(
        f"Checkpoint {checkpoint} was trained with the plugin {module!r} from --user-dir {path}{where}, which does "
        f"not exist here. Pass --user-dir with the plugin's folder as it is now (a Python package, such as "
        f"path/to/{module}, whose __init__.py registers the checkpoint's task, model and criterion); it is "
        "used instead of the recorded one.")
