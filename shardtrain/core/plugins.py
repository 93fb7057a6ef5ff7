"""Components from installed packages: the ``shardtrain.plugins`` entry-point group.

A package adds tasks, models, architectures, optimizers, ... by declaring an
entry point in its packaging metadata (``pyproject.toml``)::

    [project.entry-points."shardtrain.plugins"]
    my_models = "my_package.shardtrain_models"       # a module: importing it registers
    my_optim = "my_package.plugin:register"          # a callable: called with no arguments

Nothing is loaded when shardtrain is imported. Every command that builds a
config calls :func:`load_plugins` before it resolves component names (see
``shardtrain.config.run_config``), so a plugin's names work with ``--task``,
``--arch``, ``--optimizer``, ... and in saved checkpoint configs alike.
``--user-dir`` remains the way to use a plugin that is not installed.
"""
import functools
import importlib.metadata
import inspect
from typing import Iterable, List, Tuple

from shardtrain.core.errors import ConfigError

GROUP = "shardtrain.plugins"


@functools.lru_cache(maxsize=None)
def load_plugins() -> Tuple[str, ...]:
    """Load every installed plugin, once per process; -> their entry-point names.

    Cached because registration cannot run twice (a registry refuses a name it
    already holds) while several config-building paths of one command call this.
    """
    return tuple(load_entry_points(importlib.metadata.entry_points(group=GROUP)))


def load_entry_points(entry_points: Iterable[importlib.metadata.EntryPoint]) -> List[str]:
    """Import (or call) each entry point, in name order so that any clash
    between two plugins shows up the same way on every machine."""
    loaded = []
    for ep in sorted(entry_points, key=lambda ep: (ep.name, ep.value)):
        try:
            target = ep.load()
            if not inspect.ismodule(target):
                if not callable(target):
                    raise TypeError(f"{ep.value} is {target!r}, not a module or a callable")
                target()
        except Exception as e:  # noqa: BLE001 - whatever a plugin raises, the user must see which plugin
            raise ConfigError(failure_message(ep, e)) from e
        loaded.append(ep.name)
    return loaded


def failure_message(ep: importlib.metadata.EntryPoint, error: Exception) -> str:
    """One paragraph: which plugin, from which distribution, what it raised, how to get past it."""
    dist = getattr(ep, "dist", None)
    if dist is not None:
        origin = f"distribution {dist.name} {dist.version}"
        remedy = f"or uninstall it (`pip uninstall {dist.name}`)"
    else:
        origin, remedy = "an unknown distribution", "or uninstall the package that declares it"
    # one paragraph, even for multi-line errors; its own full stop dropped (ours follows)
    reason = " ".join(f"{type(error).__name__}: {str(error).rstrip('.')}".split())
    return (f"Plugin {ep.name!r} (entry point {ep.value!r} in group {GROUP!r}, from {origin}) failed to load: "
            f"{reason}. Fix the plugin (`python -c 'import {ep.module}'` shows the traceback) {remedy}.")
