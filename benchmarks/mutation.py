"""Mutation score: does the test suite catch small, realistic bugs against README's claims?

Each mutant (benchmarks/mutants_<area>.py, gathered by mutants.py) is one exact, unique ``old`` -> ``new``
replacement in one file. For every run the committed HEAD is exported into a
temporary directory (``git archive HEAD``): the working tree is never touched,
so this runs beside people and helpers who edit and test it. Each mutant is
applied there, its tests run (``python -m pytest -q -x`` with that directory
as cwd and first on PYTHONPATH, so the copy wins over the editable install,
also in the ranks and commands the tests spawn; checked before anything runs),
and the file is restored.

    python benchmarks/mutation.py [--only NAME[,NAME]] [--list] [--jobs 1] [--timeout 900] [--worktree]

Verdicts:
- ``caught``: pytest failed (exit 1, or 2 for an interrupted run) on the mutant.
- ``SURVIVED``: every test passed on the mutant: a missing test.
- ``timeout``: the tests ran past ``--timeout``. Counted as NOT caught: a hang
  is not a verdict (a loaded machine also times out), and a score must not rise
  because something got slow.
- ``baseline-fails``: one of the mutant's tests already fails on HEAD
  (a first unmutated pass over the union of the tests). Not caught: a failure
  the mutant did not cause proves nothing about it.

A mutant whose ``old`` snippet is not found exactly once stops the run before
anything is tested ("mutant X no longer applies"): the list must follow the
code. The exit status is 0 otherwise (this is a report, not a gate); the last
line is ``RESULT mutation_score=<caught/total> target>=0.95``.
"""
import argparse
import concurrent.futures
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Set, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mutants import MUTANTS, Mutant  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = 0.95


def export_head(dest: str) -> str:
    """The committed HEAD (not the working tree) as plain files under ``dest``."""
    os.makedirs(dest, exist_ok=True)
    archive = subprocess.run(["git", "-C", REPO, "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return dest


def export_worktree(dest: str) -> str:
    """The working tree as it is now (tracked and untracked, not ignored files) under ``dest``: for a session
    that checks its new mutants before committing. Files are copied, so edits made meanwhile do not leak in."""
    listed = subprocess.run(["git", "-C", REPO, "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                            capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        src = os.path.join(REPO, name)
        if os.path.isfile(src) and not os.path.islink(src):
            os.makedirs(os.path.dirname(os.path.join(dest, name)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, name))
    return dest


def test_env(root: str) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    # No .pyc: a mutated and a restored file written within one second with the same
    # size would otherwise share a cached bytecode (pyc validation is mtime + size).
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_resolve_to(root: str) -> None:
    """``import shardtrain`` must find the copy, in pytest's process and in a process it spawns."""
    code = ("import os, subprocess, sys, shardtrain; print(os.path.realpath(shardtrain.__file__)); "
            "print(subprocess.run([sys.executable, '-c', 'import os, shardtrain; "
            "print(os.path.realpath(shardtrain.__file__))'], capture_output=True, text=True, check=True).stdout)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=test_env(root), capture_output=True,
                         text=True, check=True).stdout.split()
    want = os.path.realpath(os.path.join(root, "shardtrain", "__init__.py"))
    if out != [want, want]:
        raise SystemExit(f"import shardtrain resolves to {out}, not the exported copy {want}: "
                         "the mutants would be tested against another tree.")


def apply(root: str, m: Mutant) -> Tuple[str, str]:
    """Apply ``m`` in ``root``; returns (path, original text) for :func:`restore`."""
    path = os.path.join(root, m.file)
    if not os.path.isfile(path):
        raise SystemExit(f"mutant {m.name} no longer applies: {m.file} does not exist")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    count = text.count(m.old)
    if count != 1:
        raise SystemExit(f"mutant {m.name} no longer applies: its `old` snippet occurs {count} times "
                         f"in {m.file} (must be exactly once); update it in its benchmarks/mutants_<area>.py")
    _write(path, text.replace(m.old, m.new))
    return path, text


def restore(saved: Tuple[str, str]) -> None:
    _write(*saved)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def check_all_apply(root: str, mutants: List[Mutant]) -> None:
    """Every mutant applies to HEAD and names test files that exist, before anything runs."""
    for m in mutants:
        restore(apply(root, m))
        for test in m.tests:
            if not os.path.exists(os.path.join(root, test.split("::")[0])):
                raise SystemExit(f"mutant {m.name} names a test that does not exist: {test}")


def run_pytest(root: str, tests: List[str], timeout: float, stop_first: bool) -> Tuple[Optional[int], str, float]:
    """(exit status or None on timeout, output, seconds)."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"] + (["-x"] if stop_first else [])
    start = time.monotonic()
    proc = subprocess.Popen(argv + tests, cwd=root, env=test_env(root), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.monotonic() - start
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # pytest and every rank or command it spawned
        out, _ = proc.communicate()
        return None, out, time.monotonic() - start


def failing_at_baseline(root: str, mutants: List[Mutant], timeout: float) -> Set[str]:
    """Node ids that fail (or error) on unmutated HEAD, over the union of the mutants' tests."""
    tests = sorted({t for m in mutants for t in m.tests})
    rc, out, seconds = run_pytest(root, tests, timeout, stop_first=False)
    print(f"baseline: {len(tests)} test ids unmutated, exit {rc}, {seconds:.0f}s", flush=True)
    if rc is None:
        raise SystemExit(f"the unmutated baseline ran past {timeout:.0f}s; raise --baseline-timeout")
    if rc not in (0, 1):
        raise SystemExit(f"the unmutated baseline could not run (pytest exit {rc}):\n{out[-3000:]}")
    failing = set(re.findall(r"^(?:FAILED|ERROR) (\S+)", out, flags=re.M))
    for node in sorted(failing):
        print(f"baseline: FAILS unmutated: {node}", flush=True)
    return failing


def touches(test: str, failing: Set[str]) -> bool:
    return any(node == test or node.startswith(test + "::") or node.startswith(test + "[") for node in failing)


def run_mutant(root: str, m: Mutant, timeout: float, failing: Set[str]) -> Tuple[str, float]:
    if any(touches(t, failing) for t in m.tests):
        return "baseline-fails", 0.0
    saved = apply(root, m)
    try:
        rc, out, seconds = run_pytest(root, list(m.tests), timeout, stop_first=True)
    finally:
        restore(saved)
    if rc is None:
        return "timeout", seconds
    if rc in (1, 2):
        return "caught", seconds
    if rc == 0:
        return "SURVIVED", seconds
    raise SystemExit(f"mutant {m.name}: pytest exit {rc} (tests not found or not collected?):\n{out[-3000:]}")


def print_table(rows: List[Tuple[Mutant, str, float]]) -> None:
    print(f"\n| mutant | claim | tests | result | s |\n|---|---|---|---|---|")
    for m, verdict, seconds in rows:
        print(f"| {m.name} | {m.claim} | {', '.join(m.tests)} | {verdict} | {seconds:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated mutant names")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once (one exported tree each)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant's tests")
    parser.add_argument("--baseline-timeout", type=float, default=3600.0, help="seconds for the unmutated pass")
    parser.add_argument("--worktree", action="store_true",
                        help="test the working tree's files as they are now instead of the committed HEAD")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated pass (trust HEAD)")
    args = parser.parse_args()
    names = [m.name for m in MUTANTS]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SystemExit(f"duplicate mutant names: {duplicates}")
    mutants = MUTANTS
    if args.only:
        wanted = args.only.split(",")
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise SystemExit(f"unknown mutants {unknown}; --list shows them")
        mutants = [m for m in MUTANTS if m.name in wanted]
    if args.list:
        for m in mutants:
            print(f"{m.name:32s} {m.file}  [{m.claim}]  -> {' '.join(m.tests)}")
        return
    top = tempfile.mkdtemp(prefix="shardtrain-mutation-")
    try:
        export = export_worktree if args.worktree else export_head
        roots = [export(os.path.join(top, f"tree{i}")) for i in range(max(1, args.jobs))]
        check_imports_resolve_to(roots[0])
        check_all_apply(roots[0], mutants)
        failing = set() if args.no_baseline else failing_at_baseline(roots[0], mutants, args.baseline_timeout)
        free: "queue.Queue[str]" = queue.Queue()
        for root in roots:
            free.put(root)

        def one(m: Mutant) -> Tuple[str, float]:
            root = free.get()
            try:
                verdict, seconds = run_mutant(root, m, args.timeout, failing)
            finally:
                free.put(root)
            print(f"{m.name}: {verdict} ({seconds:.0f}s)", flush=True)
            return verdict, seconds

        with concurrent.futures.ThreadPoolExecutor(len(roots)) as pool:
            results = list(pool.map(one, mutants))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    rows = [(m, v, s) for m, (v, s) in zip(mutants, results)]
    print_table(rows)
    caught = sum(v == "caught" for _, v, _ in rows)
    survivors = [m.name for m, v, _ in rows if v != "caught"]
    if survivors:
        print(f"\nnot caught ({len(survivors)}): {', '.join(survivors)}")
    print(f"RESULT mutation_score={caught / len(rows):.3f} target>={TARGET}")


if __name__ == "__main__":
    main()
