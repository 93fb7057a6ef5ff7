"""Every mutant of benchmarks/mutants.py still applies: its text is in its file exactly once, and the tests it
names exist. A refactor that moves the text a mutant breaks leaves the mutant testing nothing (mutation.py would
report it as not applying only in a full run, ~50 minutes): this fails at once, naming it."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import mutants  # noqa: E402


def _read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def test_every_mutants_text_is_in_its_file_exactly_once():
    stale = [f"{m.name}: {m.file} holds its text {_read(m.file).count(m.old)} times"
             for m in mutants.MUTANTS if _read(m.file).count(m.old) != 1]
    assert not stale, "\n".join(stale)


def test_every_mutant_names_test_files_that_exist_and_functions_in_them():
    missing = []
    for m in mutants.MUTANTS:
        for node in m.tests:
            path, _, rest = node.partition("::")
            function = rest.split("[")[0]
            if not os.path.isfile(os.path.join(ROOT, path)):
                missing.append(f"{m.name}: no file {path}")
            elif function and f"def {function}(" not in _read(path):
                missing.append(f"{m.name}: no test {function} in {path}")
    assert not missing, "\n".join(missing)
