"""Which tests exercise each flag of shard-train at a non-default value (issue 29).

A test that passes a flag a non-default value and asserts that value's effect declares it:
``@pytest.mark.flag_effect("--update-freq")`` on the function or class, or a module-level
``pytestmark``. The markers are read from the source (AST), nothing is run. A marked flag counts only
if its string literal (``"--update-freq"``, its Hydra key ``optimization.update_freq``, or a string
that is exactly its field name, ``"update_freq"``, as config dicts spell it) occurs in the test's
module or in a tests/ helper module it imports: a marker is a claim, the literal is the least evidence
that the test passes the flag at all.

The flags are every option of ``shard-train`` for every registered task, model, criterion, optimizer
and lr scheduler (not only the defaults). fairseq's flags from the compatibility table (ACCEPTED,
in --help's "fairseq compatibility" group, or REFUSED) are not listed: tests/config/test_flag_coverage.py holds them to lists
written down there.

    python benchmarks/flag_coverage.py [--tests DIR]

The last line is ``RESULT uncovered_flags=N target==0``.
"""
import argparse
import ast
import dataclasses
import os
import re
import sys
from typing import Dict, List, Optional, Set, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # this tree's shardtrain, also when run as a script (and in a mutant's copy)
    sys.path.insert(0, REPO)
TESTS = os.path.join(REPO, "tests")
MARKER = "flag_effect"

# Flags whose value changes nothing a test could assert about training. Short and honest: a flag
# that changes behaviour is not exempt, however hard its test is to write.
EXEMPT = {
    "--help": "prints the help and exits (tests/cli/test_help_flags.py reads it as text)",
    "--amp-batch-retries": "parsed for fairseq, used by nothing: an overflowing --amp update is skipped and the "
                           "next batch runs at the lowered scale, as with --fp16 (its help says so)",
}


@dataclasses.dataclass
class Flag:
    names: Tuple[str, ...]  # its option strings: the flag, then aliases / the --no- form
    key: str  # the config key it sets (its Hydra key), "section.field"
    groups: Set[str]  # the help groups it appears in, e.g. "optimizer (adam)"

    @property
    def name(self) -> str:
        return self.names[0]


@dataclasses.dataclass(frozen=True)
class Mark:
    node: str  # the test's node id (a module for module-level pytestmark)
    flags: Tuple[str, ...]


@dataclasses.dataclass
class Report:
    flags: Dict[str, Flag]  # by Flag.name
    covering: Dict[str, List[str]]  # flag name -> node ids whose marker counts
    uncovered: List[str]  # behaviour-changing flags without a counted marker
    problems: List[str]  # markers that do not count, and why


def _built_in(obj) -> bool:
    """A component shardtrain itself ships: the coverage is of shard-train's flags, not of plugins that
    tests (or a --user-dir imported earlier in this process) registered."""
    return getattr(obj, "__module__", "").startswith("shardtrain.")


def _selections() -> List[List[str]]:
    """One command line per built-in component (models once, through one of their archs)."""
    from shardtrain.config.components import registries
    regs = registries()
    out = [[]]
    out += [["--task", name] for name in regs["task"].names() if _built_in(regs["task"].get(name).obj)]
    archs = regs["model"][1]
    first_arch = {}
    for name in archs.names():
        if _built_in(archs.get(name).obj.model):
            first_arch.setdefault(archs.get(name).obj.model, name)
    out += [["--arch", arch] for arch in first_arch.values()]
    for flag, slot in (("--criterion", "criterion"), ("--optimizer", "optimizer"),
                       ("--lr-scheduler", "lr_scheduler")):
        out += [[flag, name] for name in regs[slot].names() if _built_in(regs[slot].get(name).obj)]
    return out


def train_flags() -> Dict[str, Flag]:
    """Every option of shard-train under every registered component, by its first long name."""
    from shardtrain.config.run_config import build_train_parser
    found: Dict[str, Flag] = {}
    for argv in _selections():
        parser, _ = build_train_parser(argv)
        for group in parser._action_groups:  # argparse has no public way to walk its groups
            for action in group._group_actions:
                if not action.option_strings or action.dest.startswith("fairseq_flags."):
                    continue  # positionals (DATA) are not flags; table flags are held elsewhere
                names = tuple(sorted(action.option_strings, key=lambda n: not n.startswith("--")))
                flag = found.setdefault(names[0], Flag(names, action.dest, set()))
                flag.groups.add(group.title)
    return found


def other_command_flags() -> Set[str]:
    """The options of the other dataclass-built commands (shard-eval-lm, shard-validate, ...): a marker may
    name them (their tests declare their effects too), but this list is shard-train's."""
    from shardtrain.cli import consolidate, eval_lm, generate, import_fairseq, interactive, validate
    from shardtrain.config.flags import flag_name
    from shardtrain.data.preprocess import PreprocessConfig
    out = set()
    for cls in (validate.ValidateConfig, generate.GenerateConfig, consolidate.ConsolidateConfig,
                eval_lm.EvalLMConfig, interactive.InteractiveConfig, import_fairseq.ImportFairseqConfig,
                PreprocessConfig):
        for f in dataclasses.fields(cls):
            out.update((flag_name(f.name), *f.metadata.get("aliases", ())))
    from shardtrain.cli import plan  # shard-plan's own options, beside shard-train's
    out.update(s for action in plan._own_parser(add_help=False)._actions for s in action.option_strings)
    return out


_SPELLING = "(?<![\\w-]){}(?![\\w-])"


def _marker_args(node: ast.AST) -> Optional[List[ast.expr]]:
    """The arguments of ``<...>.flag_effect(...)``, or None if ``node`` is not that call."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == MARKER:
        return node.args
    return None


def _strings(tree: ast.AST) -> List[str]:
    """Every string constant of a module except the flag_effect markers' own arguments."""
    skip = {id(arg) for node in ast.walk(tree) for arg in (_marker_args(node) or ())}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in skip]


def _imported_helpers(tree: ast.Module, path: str, tests_dir: str) -> List[str]:
    """The tests/ modules this module imports (``from st_testutils import``, ``from .fakes import``,
    ``import tests.x``): pytest's rootdir mode finds them in the test's folder or in tests/, and tests/conftest.py
    puts tests/helpers on sys.path."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    out = []
    for name in names:
        parts = name.split(".")
        if parts[0] == "tests":
            parts = parts[1:]
        for base in (os.path.dirname(path), tests_dir, os.path.join(tests_dir, "helpers")):
            candidate = os.path.join(base, *parts)
            for file in (candidate + ".py", os.path.join(candidate, "__init__.py")):
                if parts and os.path.isfile(file) and file != path and file not in out:
                    out.append(file)
    return out


def _marks_in(tree: ast.Module, module_id: str) -> List[Tuple[str, List[ast.expr], int]]:
    """(node id, marker arguments, line) for every flag_effect marker of a test module."""
    found = []

    def from_pytestmark(body, node_id):
        for stmt in body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                    for t in stmt.targets):
                values = stmt.value.elts if isinstance(stmt.value, (ast.List, ast.Tuple)) else [stmt.value]
                found.extend((node_id, _marker_args(v), v.lineno) for v in values if _marker_args(v) is not None)

    def from_decorators(node, node_id):
        found.extend((node_id, _marker_args(d), d.lineno) for d in node.decorator_list
                     if _marker_args(d) is not None)

    from_pytestmark(tree.body, module_id)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            from_decorators(node, f"{module_id}::{node.name}")
        elif isinstance(node, ast.ClassDef):
            class_id = f"{module_id}::{node.name}"
            from_decorators(node, class_id)
            from_pytestmark(node.body, class_id)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    from_decorators(item, f"{class_id}::{item.name}")
    return found


def _parse(path: str) -> ast.Module:
    with open(path) as f:
        return ast.parse(f.read(), path)


def _passed(spelling: str, key: str, text: str, exact: Set[str]) -> bool:
    """Whether the module's strings pass the flag: as written, as its Hydra key, or as a config dict's key."""
    if re.search(_SPELLING.format(re.escape(spelling)), text):
        return True
    return bool(key) and (re.search(_SPELLING.format(re.escape(key)), text) is not None
                          or key.split(".", 1)[1] in exact)


def scan_markers(tests_dir: str, flags: Dict[str, Flag], others: Set[str] = frozenset()) -> Tuple[List[Mark], List[str]]:
    """The markers that count, and a line per marker (or argument) that does not. ``others``: flags of
    other commands, accepted in markers when the module passes them, and not counted here."""
    by_spelling = {name: flag for flag in flags.values() for name in flag.names}
    train_names = set(by_spelling)
    by_spelling.update({name: Flag((name,), "", set()) for name in others if name not in by_spelling})
    root = os.path.dirname(os.path.abspath(tests_dir))
    marks, problems = [], []
    for folder, _, files in sorted(os.walk(tests_dir)):
        for file in sorted(f for f in files if f.startswith("test") and f.endswith(".py")):
            path = os.path.join(folder, file)
            tree = _parse(path)
            found = _marks_in(tree, os.path.relpath(path, root))
            if not found:
                continue
            strings = _strings(tree) + [s for helper in _imported_helpers(tree, path, tests_dir)
                                        for s in _strings(_parse(helper))]
            text, exact = "\n".join(strings), set(strings)
            for node_id, args, line in found:
                named = []
                for arg in args or [None]:
                    where = f"{node_id} (line {line})"
                    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                        problems.append(f"{where}: flag_effect takes flags as string literals, one or more")
                    elif arg.value not in by_spelling:
                        problems.append(f"{where}: {arg.value!r} is not a flag of shard-train (or of another command)")
                    elif not _passed(arg.value, by_spelling[arg.value].key, text, exact):
                        problems.append(f"{where}: marks {arg.value} but neither it nor its key "
                                        f"{by_spelling[arg.value].key} occurs in the module or its tests/ helpers")
                    elif arg.value in train_names:
                        named.append(by_spelling[arg.value].name)
                if named:
                    marks.append(Mark(node_id, tuple(named)))
    return marks, problems


def coverage(tests_dir: str = TESTS, flags: Optional[Dict[str, Flag]] = None,
             exempt: Optional[Dict[str, str]] = None) -> Report:
    """``flags``: shard-train's (default) or a test's own; ``exempt``: EXEMPT (default)."""
    others = other_command_flags() if flags is None else set()
    flags = train_flags() if flags is None else flags
    exempt = EXEMPT if exempt is None else exempt
    marks, problems = scan_markers(tests_dir, flags, others)
    problems += [f"EXEMPT names {name}, which is not a flag of shard-train" for name in exempt if name not in flags]
    covering = {name: [] for name in flags}
    for mark in marks:
        for name in mark.flags:
            if mark.node not in covering[name]:
                covering[name].append(mark.node)
    uncovered = [name for name in flags if not covering[name] and name not in exempt]
    return Report(flags, covering, uncovered, problems)


def _section(title: str) -> str:
    """``"optimizer (adam)"`` -> ``"optimizer"``: a component slot's flags are listed together."""
    return title.split(" (")[0]


def by_group(report: Report, names: List[str]) -> Dict[str, List[str]]:
    """The flags in ``names`` by help group, a component slot's (all optimizers', say) as one group."""
    out: Dict[str, List[str]] = {}
    for name in names:
        out.setdefault(_section(min(report.flags[name].groups)), []).append(name)
    return out


def _owners(flag: Flag) -> str:
    """``"(adam, adamw)"`` for a component's flag, empty for the framework's."""
    names = sorted(t.split(" (")[1][:-1] for t in flag.groups if " (" in t)
    return f" ({', '.join(names)})" if names else ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default=TESTS, help="the tests folder to scan (default: the repo's)")
    args = parser.parse_args(argv)
    report = coverage(args.tests)
    for group, names in by_group(report, list(report.flags)).items():
        print(f"[{group}]")
        for name in names:
            tests = report.covering[name] or [f"EXEMPT: {EXEMPT[name]}" if name in EXEMPT else "-"]
            print(f"  {name + _owners(report.flags[name]):<40} {tests[0]}")
            for node in tests[1:]:
                print(f"  {'':<40} {node}")
    print(f"\n{len(report.uncovered)} of {len(report.flags)} flags change behaviour and have no marked test:")
    for group, names in by_group(report, report.uncovered).items():
        print(f"  [{group}] {' '.join(names)}")
    if report.problems:
        print(f"\n{len(report.problems)} markers do not count:")
        for line in report.problems:
            print(f"  {line}")
    print(f"RESULT uncovered_flags={len(report.uncovered)} target==0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
