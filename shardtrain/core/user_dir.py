"""``--user-dir``: a plugin folder imported by path, and what a checkpoint says about it.

A run's config holds the plugin folder as an absolute path (:func:`with_user_dir_imported`
resolves the one given against the working directory), and a checkpoint's header records it
with the module name it was imported as and a hash of its ``.py`` files (:func:`record`).

A command that loads a checkpoint imports a plugin only when the user names it (``--user-dir``, or an
installed ``shardtrain.plugins`` entry point), never the folder the checkpoint records: anyone who can
hand over or edit a checkpoint could otherwise run code on this machine, and checksums do not help
(an editor recomputes them). A checkpoint that needs a plugin not given is refused, naming it
(:func:`for_checkpoint`); a given one whose files changed since the save is loaded with a warning.
"""
import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import stat
import sys
from typing import Dict, List, Optional, Tuple

from shardtrain.core.errors import ConfigError
from shardtrain.core.fileio import file_kind, open_regular
from shardtrain.core.plugins import GROUP

logger = logging.getLogger(__name__)
HEADER_KEY = "plugin"  # a checkpoint header's {"user_dir": absolute path, "module": name, "sha256": files_sha256}
# --user-dir of the commands that load a checkpoint
LOADING_HELP = ("the plugin folder (a Python package) that registers the checkpoint's task, model or criterion; "
                "needed for a checkpoint trained with one (shard-verify names it): the folder a checkpoint "
                "records is never imported on its own")


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
    _refuse_irregular_files(path)
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
        raise ConfigError(f"--user-dir {path} failed to import: {type(e).__name__}: {str(e).rstrip('.')}. "
                          f"Fix the error in the plugin (run `python -c 'import {name}'` from "
                          f"{parent} to see the traceback).") from e
    return path


def _py_files(folder: str) -> List[str]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found += [os.path.join(root, f) for f in files if f.endswith(".py")]
    return found


def _refuse_irregular_files(folder: str) -> None:
    """A ``.py`` name that is a FIFO or a device (or a link to one) is refused before anything reads it: reading
    it to import or hash it waits forever (a FIFO) or never ends (``/dev/zero``). A dangling link is Python's
    business: it is never read."""
    for full in _py_files(folder):
        try:
            mode = os.stat(full).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            raise ConfigError(f"--user-dir {folder}: {full} is {file_kind(mode)}, not a regular file. A plugin's "
                              ".py files are read to import them and to hash them into its checkpoints, and reading "
                              f"this one would hang or never end. Remove it (rm {full}) or replace it with a "
                              "regular file, and run again.")


def with_user_dir_imported(values: Dict) -> Dict:
    """Config ``values`` (a dict of sections) with ``common.user_dir`` imported and made absolute,
    so a checkpoint's config names the plugin folder wherever it is loaded from."""
    common = values.get("common") or {}
    if not common.get("user_dir"):
        return values
    return {**values, "common": {**common, "user_dir": import_user_dir(common["user_dir"])}}


def files_sha256(folder: str) -> str:
    """sha256 over the folder's ``.py`` files, in the order of their sorted relative paths ('/'-separated):
    for each, the path, a NUL byte, the content's length as 8 little-endian bytes, the content (a file that cannot
    be read, a dangling link say, or one that is not a regular file: the path, a NUL byte and ``unreadable``)."""
    digest = hashlib.sha256()
    for rel, full in sorted((os.path.relpath(p, folder).replace(os.sep, "/"), p) for p in _py_files(folder)):
        try:
            with open_regular(full) as f:
                data = None if f is None else f.read()
        except OSError:  # a dangling link or an unreadable file: a save must not fail on it, and a later fix shows
            data = None
        if data is None:  # a FIFO or a device put there since the import: never read (a read hangs or never ends)
            digest.update(rel.encode() + b"\0unreadable")
            continue
        digest.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def record(user_dir: Optional[str]) -> Dict:
    """The checkpoint header's entry for the run's plugin folder (empty without one)."""
    if not user_dir:
        return {}
    path = absolute(user_dir)
    return {HEADER_KEY: {"user_dir": path, "module": os.path.basename(path), "sha256": files_sha256(path)}}


def needed(state: Dict) -> Tuple[Optional[str], Optional[str]]:
    """(folder, module) of the plugin the checkpoint ``state`` was trained with; (None, None) for none.
    Checkpoints written before the header recorded it hold only the config's value (perhaps relative)."""
    recorded = state.get(HEADER_KEY) or {}
    path = recorded.get("user_dir") or ((state.get("cfg") or {}).get("common") or {}).get("user_dir")
    if not path:
        return None, None
    return path, recorded.get("module") or os.path.basename(os.path.normpath(path))


def describe(state: Dict) -> Optional[str]:
    """shard-verify's words for the plugin a checkpoint needs (None: it needs none)."""
    path, module = needed(state)
    if path is None:
        return None
    return (f"needs the plugin {module!r} from the folder {path}{_relative_note(path)}: load it with "
            f"--user-dir <folder>")


def for_checkpoint(explicit: Optional[str], state: Dict, checkpoint: str) -> Optional[str]:
    """The plugin folder to import before rebuilding the checkpoint ``state``'s components: ``explicit``
    (``--user-dir``), or None when the checkpoint used none or an installed entry point provides its module.
    A recorded folder is never returned: without ``explicit`` a checkpoint that needs one is refused."""
    path, module = needed(state)
    recorded = (state.get(HEADER_KEY) or {}).get("sha256")
    if explicit:
        if path is not None:
            _warn_if_changed(explicit, recorded, checkpoint)
        return explicit
    if path is not None and _installed(module):  # it stands in for the recorded folder: is it the same code?
        _warn_if_installed_differs(module, recorded, checkpoint)
    if path is None or _installed(module):
        return None
    raise ConfigError(
        f"Checkpoint {checkpoint} was trained with the plugin {module!r} from the folder {path}"
        f"{_relative_note(path)}, and a plugin is imported only when you name it: the folder a checkpoint records "
        "is not imported on its own, since whoever wrote or edited the checkpoint could put any code there. "
        f"If you trust that plugin, pass --user-dir <folder> with its folder as it is on this machine "
        f"(--user-dir {path} if it is still there), or install it with a {GROUP!r} entry point.")


def _relative_note(path: str) -> str:
    if os.path.isabs(path):
        return ""
    return " (recorded relative to the folder training ran in; never looked up in the working directory)"


def _installed(module: str) -> bool:
    """Whether an installed entry point comes from ``module`` (load_plugins imports it anyway)."""
    return any(ep.module.split(".")[0] == module for ep in importlib.metadata.entry_points(group=GROUP))


def warn_if_resumed_with_other_code(user_dir: Optional[str], state: Dict, checkpoint: str) -> None:
    """A run that goes on from ``checkpoint`` (its ``state``) with its own ``--user-dir``: a warning when that
    folder's .py files are not the ones the checkpoint recorded (its next save records the new ones)."""
    entry = state.get(HEADER_KEY) or {}
    if user_dir and entry.get("sha256"):
        _warn_if_changed(user_dir, entry["sha256"], checkpoint)


def _warn_if_installed_differs(module: str, recorded: Optional[str], checkpoint: str) -> None:
    """The installed package ``module`` stands in for the recorded plugin: a warning when its .py files differ."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if recorded is None or (folders and files_sha256(folders[0]) == recorded):
        return
    where = folders[0] if folders else (spec.origin if spec is not None else "not found")
    logger.warning(f"warning: the installed plugin {module!r} ({where}) is not the code checkpoint {checkpoint} was "
                   "saved with: its .py files differ from the ones recorded (their sha256 differs), so it may build "
                   "other components than the ones trained. It is used, since an installed 'shardtrain.plugins' "
                   "entry point provides that module; to load the recorded plugin instead, uninstall the package "
                   "and pass --user-dir with the plugin's folder.")


def _warn_if_changed(folder: str, recorded: Optional[str], checkpoint: str) -> None:
    path = absolute(folder)
    if recorded is None or not os.path.isdir(path):  # older checkpoints hold no hash; a missing folder: see import
        return
    if files_sha256(path) != recorded:
        logger.warning(f"warning: the plugin folder {path} (--user-dir) is not the code checkpoint {checkpoint} "
                       "was saved with: its .py files changed since (their sha256 differs from the one recorded). "
                       "It is loaded anyway, since you named it; if the results look wrong, compare it with the "
                       "plugin's version at training time.")
