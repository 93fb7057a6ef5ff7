"""``transformers`` is the tests' reference for the llama family, never a runtime dependency: no module of
shardtrain imports it, and setup's runtime requirements do not name it."""
import ast
import os

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _imports(path):
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_shardtrain_never_imports_transformers():
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "shardtrain")):
        for name in (n for n in files if n.endswith(".py")):
            path = os.path.join(folder, name)
            found += [f"{path}: {m}" for m in _imports(path) if m.split(".")[0] == "transformers"]
    assert not found, found


def test_transformers_is_a_test_requirement_only():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    runtime = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    test = text.split("\ntest = [", 1)[1].split("]", 1)[0]
    assert "transformers" not in runtime and "transformers" in test
