"""docs/ARCHITECTURE.md's import directions, held by the code.

Every module under shardtrain/ is parsed (an import inside a function counts as much as one at the
top), mapped to its room by the doc's table, and each import is checked against the rooms' levels,
the doc's exceptions and its never rules. A failure names the file, the line and the import.
"""
import ast
import pathlib
import re
from typing import Dict, List, NamedTuple, Set, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGE_ROOTS = ("shardtrain", "shardtrain.trainer")  # their __init__ files hold nothing and import nothing
# Where process groups are started: the launch, and shard-plan's fake group (behind core's private-API helpers).
GROUP_STARTERS = ("shardtrain.trainer.launch", "shardtrain.core.torch_private")
GROUP_CALLS = ("init_process_group", "new_group", "destroy_process_group")
# Loading a checkpoint for inference, and the commands that do it.
INFERENCE = ("shardtrain.trainer.checkpoint.inference", "shardtrain.cli.validate", "shardtrain.cli.generate",
             "shardtrain.cli.eval_lm", "shardtrain.cli.interactive")
TRAINING_ONLY = ("shardtrain.trainer.build", "shardtrain.trainer.trainer", "shardtrain.trainer.run",
                 "shardtrain.trainer.loop")


class Import(NamedTuple):
    importer: str
    target: str  # the module imported (a submodule where ``from package import module``)
    line: int
    in_function: bool


def _modules() -> Dict[str, pathlib.Path]:
    out = {}
    for path in sorted((ROOT / "shardtrain").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _imports(name: str, tree: ast.AST) -> List[Import]:
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend(Import(name, a.name, child.lineno, inside) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the importing module's package
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append(Import(name, sub if sub in MODULES else base, child.lineno, inside))
            visit(child, inside)

    visit(tree, False)
    return list(dict.fromkeys(found))  # ``from package import a, b`` of one module: once


IMPORTS = {name: _imports(name, tree) for name, tree in TREES.items()}


def _table(heading: str) -> List[List[str]]:
    """The rows of the first table under ``## heading`` in the doc, as lists of cells."""
    section = DOC.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip().strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows[2:]]  # past the header and its rule


def _names(cell: str) -> List[str]:
    return re.findall(r"`(shardtrain[\w.]*)`", cell)


def _rooms() -> Dict[str, int]:
    rooms = {}
    for level, cell, *_ in _table("Rooms"):
        for room in _names(cell):
            rooms[room] = int(level)
    return rooms


ROOMS = _rooms()
EXCEPTIONS = {(importer, target) for importer, target, *_ in
              ([_names(row[0])[0], _names(row[1])[0]] for row in _table("Exceptions"))}


def room_of(module: str) -> str:
    """The longest room name that is ``module`` or a package above it ('' for none)."""
    matches = [room for room in ROOMS if module == room or module.startswith(room + ".")]
    return max(matches, key=len, default="")


def _in(module: str, rooms) -> bool:
    return any(module == room or module.startswith(room + ".") for room in rooms)


def _where(imp: Import) -> str:
    return f"{MODULES[imp.importer].relative_to(ROOT)}:{imp.line} imports {imp.target}"


def test_the_doc_names_rooms_that_exist_and_every_module_has_one():
    assert ROOMS, "docs/ARCHITECTURE.md has no level table under '## Rooms'"
    missing = [room for room in ROOMS if room not in MODULES]
    assert not missing, f"docs/ARCHITECTURE.md names rooms that are no module or package: {missing}"
    homeless = [name for name in MODULES if name not in PACKAGE_ROOTS and not room_of(name)]
    assert not homeless, f"modules in no room of docs/ARCHITECTURE.md (add them to its table): {homeless}"
    for root in PACKAGE_ROOTS:
        assert not [i for i in IMPORTS[root] if i.target.startswith("shardtrain")], f"{root}/__init__ imports"


def test_every_import_runs_down_the_levels():
    """A room imports only rooms on lower levels; rooms on one level do not import each other. The
    exceptions the doc lists are allowed only inside a function (looked up when called, not on import)."""
    wrong = []
    for imports in IMPORTS.values():
        for imp in imports:
            if not imp.target.startswith("shardtrain") or imp.target in PACKAGE_ROOTS:
                continue
            here, there = room_of(imp.importer), room_of(imp.target)
            if here == there or (here in ROOMS and there in ROOMS and ROOMS[there] < ROOMS[here]):
                continue
            if (imp.importer, imp.target) in EXCEPTIONS and imp.in_function:
                continue
            wrong.append(f"{_where(imp)}: room {there} (level {ROOMS.get(there)}) from room {here} "
                         f"(level {ROOMS.get(here)})")
    assert not wrong, "imports against docs/ARCHITECTURE.md's levels:\n" + "\n".join(wrong)


def test_models_import_nothing_distributed_nor_of_the_trainer():
    wrong = [_where(imp) for name, imports in IMPORTS.items() if _in(name, ["shardtrain.models"])
             for imp in imports if _in(imp.target, ["torch.distributed", "shardtrain.trainer", "shardtrain.plan"])]
    assert not wrong, "models are pure nn.Modules, wrapped from outside:\n" + "\n".join(wrong)


def _group_calls(name: str) -> List[Tuple[int, str]]:
    return [(node.lineno, node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            for node in ast.walk(TREES[name]) if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in GROUP_CALLS]


def test_parallel_never_starts_a_process_group():
    """The backends run inside the group the launch made (a 1-rank one too: the run asks the class)."""
    wrong = [_where(imp) for name, imports in IMPORTS.items() if _in(name, ["shardtrain.trainer.parallel"])
             for imp in imports if _in(imp.target, ["shardtrain.trainer.launch"])]
    wrong += [f"{MODULES[name].relative_to(ROOT)}:{line} calls {call}" for name in MODULES
              if _in(name, ["shardtrain.trainer.parallel"]) for line, call in _group_calls(name)]
    assert not wrong, "trainer.parallel starts or ends a process group:\n" + "\n".join(wrong)


def test_process_groups_are_started_by_the_launch_only():
    wrong = [f"{MODULES[name].relative_to(ROOT)}:{line}" for name in MODULES if not _in(name, GROUP_STARTERS)
             for line, call in _group_calls(name) if call == "init_process_group"]
    assert not wrong, "init_process_group outside trainer.launch:\n" + "\n".join(wrong)


def closure(start: str) -> Dict[str, Import]:
    """Every shardtrain module importing ``start`` may import, with the import that first reached it."""
    reached: Dict[str, Import] = {}
    todo: List[str] = [start]
    seen: Set[str] = {start}
    while todo:
        for imp in IMPORTS[todo.pop()]:
            parts = imp.target.split(".")
            for target in (".".join(parts[:n]) for n in range(1, len(parts) + 1)):  # its packages run too
                if target in MODULES and target not in seen:
                    seen.add(target)
                    reached[target] = imp
                    todo.append(target)
    return reached


def test_loading_for_inference_never_reaches_the_training_build():
    """shard-validate, -generate, -eval-lm and -interactive load a model without the training code."""
    wrong = [f"{start} reaches {module}, through {_where(reached[module])}" for start in INFERENCE
             for reached in [closure(start)] for module in TRAINING_ONLY if module in reached]
    assert not wrong, "loading for inference imports training-only modules:\n" + "\n".join(wrong)


def circles(graph: Dict[str, List[str]]) -> List[List[str]]:
    """The groups of modules that import each other, directly or round a longer loop (Tarjan's strongly
    connected components of more than one module), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found = []

    def visit(v):  # iterative would do too; the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_circle_finder_finds_a_loop_of_three_and_a_pair_and_nothing_in_a_tree():
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["f"], "f": ["e"], "g": ["d"]}
    assert circles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert circles({"a": ["b", "c"], "b": ["c"], "c": []}) == []


def test_no_import_circle_anywhere():
    """Inside a room too, and imports inside functions counted: a module that must import one importing it back
    is two responsibilities in one place (the split: a chooser above the implementations, a leaf below)."""
    imports = {name: [i for i in _imports(name, tree) if i.target in MODULES and i.target != name]
               for name, tree in TREES.items()}
    graph = {name: sorted({i.target for i in found}) for name, found in imports.items()}
    named = []
    for group in circles(graph):
        lines = [_where(i) for name in group for i in imports[name] if i.target in group]
        named.append(" <-> ".join(group) + ":\n    " + "\n    ".join(lines))
    assert not named, "import circles:\n  " + "\n  ".join(named)
