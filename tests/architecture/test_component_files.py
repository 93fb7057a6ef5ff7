"""docs/ARCHITECTURE.md's "Adding a component", held by the code: a built-in backend, precision or optimizer is its
file plus one import line in its chooser, and no other module imports it but the doc's listed exceptions (a new
component then needs no edit elsewhere). The plugin row is shown by the toy plugins' tests the doc names."""
import pathlib
import re
from typing import Dict, List, Set

import pytest

from shardtrain.optim.registry import OPTIMIZER_REGISTRY
from shardtrain.trainer.parallel.base import BACKEND_REGISTRY
from shardtrain.trainer.precision.registry import PRECISION_REGISTRY
import shardtrain.optim  # noqa: F401  (registers the built-in optimizers)
import shardtrain.trainer.parallel.choose  # noqa: F401  (registers the built-in backends)
import shardtrain.trainer.precision.choose  # noqa: F401  (registers the built-in precisions)
from test_import_directions import IMPORTS

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
SECTION = DOC[DOC.index("## Adding a component"):]
KINDS = {  # the doc's row name: (registry, chooser module)
    "backend": (BACKEND_REGISTRY, "shardtrain.trainer.parallel.choose"),
    "precision": (PRECISION_REGISTRY, "shardtrain.trainer.precision.choose"),
    "optimizer": (OPTIMIZER_REGISTRY, "shardtrain.optim"),
}


def _importers() -> Dict[str, Dict[str, List[int]]]:
    """module -> {importing module: [lines]}, from test_import_directions' reading of every import (inside
    functions and relative ones too)."""
    found: Dict[str, Dict[str, List[int]]] = {}
    for imports in IMPORTS.values():
        for imp in imports:
            found.setdefault(imp.target, {}).setdefault(imp.importer, []).append(imp.line)
    return found


IMPORTERS = _importers()


def _allowed() -> Dict[str, Set[str]]:
    """The doc's table of modules that may import a component's module besides its chooser."""
    allowed: Dict[str, Set[str]] = {}
    for row in re.findall(r"^\| `(shardtrain\.[\w.]+)` \| ((?:`[\w.]+`(?:, )?)+) \|", SECTION, re.M):
        allowed[row[0]] = set(re.findall(r"`([\w.]+)`", row[1]))
    return allowed


def test_the_doc_says_two_files_for_each_kind_and_one_for_a_plugin():
    rows = dict(re.findall(r"^\| (backend|precision|optimizer|plugin backend, precision or optimizer) \| (\d+) \|",
                           SECTION, re.M))
    assert rows == {"backend": "2", "precision": "2", "optimizer": "2", "plugin backend, precision or optimizer": "1"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_built_in_is_its_file_and_one_import_line_in_its_chooser(kind):
    registry, chooser = KINDS[kind]
    allowed = _allowed()
    modules = {getattr(e.obj, "__module__", "") for e in registry.entries()}
    modules = {m for m in modules if m.startswith("shardtrain.") and m != chooser}
    assert modules, f"no built-in {kind} found"
    wrong = []
    for module in sorted(modules):
        importers = IMPORTERS.get(module, {})
        lines = importers.get(chooser, [])
        if len(lines) != 1:
            wrong.append(f"{module} is imported {len(lines)} times by its chooser {chooser} (once, to register)")
        others = set(importers) - {chooser, module} - allowed.get(module, set())
        if others:
            wrong.append(f"{module} is also imported by {', '.join(sorted(others))}: a new {kind} would need "
                         "that edit too (list it in the doc's table with why, or ask the registry there instead)")
    assert not wrong, "\n".join(wrong)
