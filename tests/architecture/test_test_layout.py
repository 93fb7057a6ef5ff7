"""tests/ mirrors the rooms of docs/ARCHITECTURE.md: a test file sits in the folder of the room it tests.

A room's folder is its module path under tests/ (``shardtrain.trainer.checkpoint`` -> ``tests/trainer/checkpoint``);
a room without a folder of its own is tested in its package's (``shardtrain.trainer.spike`` -> ``tests/trainer``).
What a file tests is read from what it imports (itself, and the helper modules beside it or in tests/helpers), or,
for a file that drives the commands and so imports no room's code, from its ``TESTS_ROOM = "shardtrain.<room>"``:
- it imports at least one module of its folder's room(s);
- it imports nothing from another room that has a folder while importing nothing of its own folder's but the
  base every test uses (``core``, ``config``, ``cli``), i.e. it is not a test of another room filed here;
- a file that itself imports a room whose folder lies below its own (``tests/trainer/precision/`` below
  ``tests/trainer/``) and, of its own folder's room, only what builds or starts a run (DRIVERS) tests that room:
  it is filed there (or says ``TESTS_ROOM``).
A few folders are not rooms; each says what it holds in NOT_ROOMS."""
import ast
import os
import re

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)

NOT_ROOMS = {
    "e2e": "scenarios across rooms, run as a user runs them (the demo, the first command, fairseq's guide)",
    "architecture": "the repository's own rules (import directions, this layout, the test tiers)",
    "docs": "what README.md and docs/ say, checked against the code",
    "packaging": "the wheel, the offline install, the venv",
    "examples": "the scripts in examples/",
    "benchmark_scripts": "the scripts in benchmarks/ (the GPU acceptance runner, the plan's accuracy check)",
    "gpu": "tests that need a GPU, run by benchmarks/gpu/run_all.py on a GPU machine",
    "helpers": "modules tests in several rooms share (no tests)",
    "fixtures": "files made by fairseq 0.12.2 (no tests)",
}
BASE = ("shardtrain.core", "shardtrain.config", "shardtrain.cli", "shardtrain.errors")
# What a test imports to build or start a training run, whatever it tests: it does not make a file the test of
# tests/trainer/ (a precision test that trains through the loop is still a precision test).
DRIVERS = ("shardtrain.trainer.loop", "shardtrain.trainer.launch.start", "shardtrain.trainer.resolved")


def rooms():
    text = open(os.path.join(REPO, "docs", "ARCHITECTURE.md")).read()
    found = re.findall(r"^\| \d+ \| `(shardtrain[\w.]*)` \|", text, re.M)
    assert len(found) >= 20, "docs/ARCHITECTURE.md's room table was not found"
    return found


def folders_with_tests():
    """Every folder holding tests: (relative path, its module prefix), deepest first."""
    out = []
    for root, dirs, files in os.walk(TESTS):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(root, TESTS)
        if rel != "." and any(f.startswith("test_") and f.endswith(".py") for f in files):
            out.append(rel)
    return out


def owner(module, folders):
    """The test folder that owns a shardtrain module: its room's module path, or the nearest package above it
    that has a folder."""
    room = max((r for r in rooms() if module == r or module.startswith(r + ".")), key=len, default=None)
    if room is None:
        return None
    parts = room.split(".")[1:]
    while parts:
        if "/".join(parts) in folders:
            return "/".join(parts)
        parts.pop()
    return None


def imported(path):
    """The shardtrain modules a file imports anywhere in it (``from a import b``: ``a.b`` where that is a module's
    name, else ``a``), and the local modules it imports (candidates for helpers)."""
    tree = ast.parse(open(path).read(), path)
    modules, local = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            (modules if name.startswith("shardtrain") else local).add(name)
    modules |= declared(tree)  # a declared room counts as imported (and must be a room: owner() finds it or not)
    return modules, local


def declared(tree):
    return {node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["TESTS_ROOM"]}


def belongs_below(path, rel, folders):
    """The folder below tests/<rel>/ a file belongs in: it imports (itself, not through its helpers) that room's
    code and, of its own folder's room, only DRIVERS; None where it is filed right."""
    direct = imported(path)[0]
    if declared(ast.parse(open(path).read(), path)):
        return None
    subjects = {owner(m, folders) for m in direct if not any(m == d or m.startswith(d + ".") for d in DRIVERS)}
    below = sorted(o for o in subjects - {None} if o.startswith(rel + "/"))
    return below[0] if below and rel not in subjects else None


def file_imports(path):
    """What a test file imports, with the helper modules (beside it, or in tests/helpers) it imports, one level."""
    modules, local = imported(path)
    for name in local:
        for folder in (os.path.dirname(path), os.path.join(TESTS, "helpers")):
            helper = os.path.join(folder, name.split(".")[0] + ".py")
            if os.path.isfile(helper) and not os.path.basename(helper).startswith("test_"):
                modules |= imported(helper)[0]
    return modules


def misplaced():
    folders = set(folders_with_tests())
    problems = []
    for rel in sorted(folders):
        top = rel.split("/")[0]
        for name in sorted(os.listdir(os.path.join(TESTS, rel))):
            if not (name.startswith("test_") and name.endswith(".py")):
                continue
            path = os.path.join(TESTS, rel, name)
            shown = f"tests/{rel}/{name}"
            if top in NOT_ROOMS:
                if top in ("helpers", "fixtures"):
                    problems.append(f"{shown}: tests/{top}/ holds no tests ({NOT_ROOMS[top]})")
                continue
            if owner("shardtrain." + rel.replace("/", "."), folders) != rel and not any(
                    owner(r, folders) == rel for r in rooms()):
                problems.append(f"{shown}: tests/{rel}/ is no room of docs/ARCHITECTURE.md nor one of "
                                f"{sorted(NOT_ROOMS)}")
                continue
            owners = {owner(m, folders) for m in file_imports(path)} - {None}
            own = rel in owners
            others = {o for o in owners if o != rel and not any(("shardtrain." + o.replace("/", ".")).startswith(b)
                                                                 for b in BASE)}
            if not own:
                where = ", ".join(f"tests/{o}/" for o in sorted(others)) or "tests/e2e/ (it imports no room's code)"
                problems.append(f"{shown}: imports nothing of the room(s) tests/{rel}/ tests; move it to {where}")
            elif belongs_below(path, rel, folders):
                problems.append(f"{shown}: imports of tests/{rel}/'s room only what starts a run ({', '.join(DRIVERS)})"
                                f"; it tests the room below: move it to tests/{belongs_below(path, rel, folders)}/")
    return problems


def test_every_test_file_sits_in_the_room_it_tests():
    assert misplaced() == []


def test_a_test_file_filed_in_another_room_is_found(tmp_path, monkeypatch):
    """The check itself: a checkpoint test filed under tests/data/, a folder that is no room, and a precision test
    that trains through the loop filed in tests/trainer/ (as five were before issue 45) are named; one that tests
    the Trainer with fp16, or declares its room, is not."""
    fake = tmp_path / "tests"
    for rel, text in {"data/test_ok.py": "from shardtrain.data.dictionary import Dictionary\n",
                      "data/test_stray.py": "from shardtrain.trainer.checkpoint.names import x\n",
                      "trainer/checkpoint/test_c.py": "from shardtrain.trainer.checkpoint.names import x\n",
                      "trainer/test_spike.py": "from shardtrain.trainer.spike import rule\n",
                      "trainer/test_stray2.py": "import shardtrain.trainer.checkpoint.names\n",
                      "nowhere/test_x.py": "import shardtrain.data\n",
                      "plot/test_declared.py": 'TESTS_ROOM = "shardtrain.plot"\n',
                      "trainer/precision/test_p.py": "from shardtrain.trainer.precision import fp16\n",
                      "trainer/test_amp_run.py": "from shardtrain.trainer.loop import train\n"
                                                 "from shardtrain.trainer.precision.fp16 import build_scaler\n",
                      "trainer/test_amp_step.py": "from shardtrain.trainer.trainer import Trainer\n"
                                                  "from shardtrain.trainer.precision.fp16 import build_scaler\n",
                      "trainer/test_amp_declared.py": "from shardtrain.trainer.loop import train\n"
                                                      "from shardtrain.trainer.precision import fp16\n"
                                                      'TESTS_ROOM = "shardtrain.trainer.loop"\n',
                      "plot/test_declared_elsewhere.py": 'TESTS_ROOM = "shardtrain.data"\n',
                      "plot/test_declared_nothing.py": 'TESTS_ROOM = "shardtrain.nothing"\n',
                      "helpers/test_h.py": "",
                      "e2e/test_e.py": ""}.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    monkeypatch.setattr(__import__(__name__), "TESTS", str(fake))
    found = misplaced()
    assert [line.split(":")[0] for line in found] == [
        "tests/data/test_stray.py", "tests/helpers/test_h.py", "tests/nowhere/test_x.py",
        "tests/plot/test_declared_elsewhere.py", "tests/plot/test_declared_nothing.py", "tests/trainer/test_amp_run.py",
        "tests/trainer/test_stray2.py"]
    assert "move it to tests/trainer/checkpoint/" in found[0] and "move it to tests/data/" in found[3]
    assert "move it to tests/trainer/precision/" in found[5]
