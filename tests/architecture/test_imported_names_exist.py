"""Every ``from shardtrain.<module> import <name>`` in the repository names something that exists.

An import inside a test function or a rank's main runs only when that test runs, often in a spawned process of the
slow tier: a name renamed in the package (``cpu_adam._local`` became ``core.dtensors.local_tensor``) broke three
tests that only the whole suite, 25 minutes later, reached. This reads the imports statically, wherever they sit
(module level, functions, helpers, benchmarks, examples), and checks them in the fast tier."""
import ast
import importlib
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FOLDERS = ("shardtrain", "tests", "benchmarks", "examples")


def _python_files():
    for folder in FOLDERS:
        for root, dirs, files in os.walk(os.path.join(REPO, folder)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            yield from (os.path.join(root, f) for f in sorted(files) if f.endswith(".py"))


def _shardtrain_imports(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and (node.module == "shardtrain" or node.module.startswith("shardtrain.")):
            yield node.lineno, node.module, [a.name for a in node.names if a.name != "*"]


def missing_names(paths):
    """``(file:line, module, name)`` for each imported name its module lacks (and that is no submodule of it)."""
    missing = []
    for path in paths:
        for line, module, names in _shardtrain_imports(path):
            where = "%s:%d" % (os.path.relpath(path, REPO), line)
            try:
                loaded = importlib.import_module(module)
            except ImportError as e:
                missing.append((where, module, "(the module: %s)" % e))
                continue
            for name in names:
                if hasattr(loaded, name):
                    continue
                try:
                    importlib.import_module(module + "." + name)
                except ImportError:
                    missing.append((where, module, name))
    return missing


def test_every_imported_shardtrain_name_exists():
    paths = list(_python_files())
    assert len(paths) > 300, "the walk found too few files: %d" % len(paths)
    assert missing_names(paths) == []


def test_a_renamed_private_name_is_found(tmp_path):
    stale = tmp_path / "stale_helper.py"
    stale.write_text("def main():\n    from shardtrain.optim.cpu_adam import CPUAdam, _local\n")
    found = missing_names([str(stale)])
    assert [(m, n) for _, m, n in found] == [("shardtrain.optim.cpu_adam", "_local")]
    assert found[0][0].endswith("stale_helper.py:2")


@pytest.mark.parametrize("source", ["from shardtrain.core import dtensors\n",
                                    "from shardtrain.core.dtensors import local_tensor, is_dtensor\n"])
def test_submodules_and_present_names_pass(tmp_path, source):
    good = tmp_path / "good.py"
    good.write_text(source)
    assert missing_names([str(good)]) == []
