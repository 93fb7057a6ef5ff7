"""The automatic mutation tool (mutmut) on each module issue 45 touched, with that module's fast tests.

The curated mutants (benchmarks/mutants_*.py, run by mutation.py) are bugs a reader thought of; mutmut makes every
small change it can (operators, constants, arguments, returns) and so finds the lines no test pins. It is a
benchmark-time tool, not a dependency of the package or of its tests:

    pip install mutmut==3.8.1          # the version these figures were taken with
    nice -n 19 python benchmarks/automatic_mutation.py [--only pinned,host_norms] [--show-survivors]

Each module runs in a scratch copy of the working tree (mutmut copies the sources into ``mutants/`` and reads its
configuration from the current folder; a copy keeps both out of the repository), mutating that one file and
running only the tests listed for it, fast tier. The verdict of every survivor (killed by a test since, or why it
stays) is in benchmarks/automatic_mutation_survivors.md.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = 0.80  # mutmut's changes include log wording and equivalent rewrites: not every survivor is a missing test

# name -> (module to mutate, its tests): the tests are the ones that import the module, fast tier only. run_facts
# and optimizer_step are listed but were not yet run (2026-12-02: time ran out after help_key)
MODULES = {
    "pinned": ("shardtrain/trainer/memory/pinned.py", ["tests/trainer/test_step_copies_and_pinned_memory.py"]),
    "host_norms": ("shardtrain/trainer/parallel/host_norms.py", ["tests/trainer/parallel/test_host_norms.py"]),
    "foreign": ("shardtrain/trainer/checkpoint/foreign.py", ["tests/trainer/checkpoint/test_foreign_files.py"]),
    "precision_registry": ("shardtrain/trainer/precision/registry.py",
                           ["tests/trainer/precision/test_precision_registration.py",
                            "tests/trainer/precision/test_fsdp_mixed_precision.py"]),
    "override_wins": ("shardtrain/config/override_wins.py", ["tests/config/test_override_wins.py"]),
    "help_key": ("shardtrain/cli/help_key.py", ["tests/cli/test_help_cache.py", "tests/cli/test_start_messages.py"]),
    "run_facts": ("shardtrain/trainer/run_facts.py",
                  ["tests/trainer/test_run_facts.py", "tests/trainer/test_cpu_step_decision.py",
                   "tests/trainer/launch/test_ranks_per_node.py"]),
    "optimizer_step": ("shardtrain/trainer/optimizer_step.py", ["tests/trainer/test_optimizer_step.py"]),
}

# forkserver: a worker forked straight from the process that ran the tests inherits torch's thread pools, and a
# mutant that reaches a ThreadPoolExecutor (host_norms.py) then hangs until the CPU limit: a timeout, not a verdict
SETUP_CFG = """[mutmut]
source_paths = shardtrain
process_isolation = forkserver
only_mutate = {module}
pytest_add_cli_args =
    -p
    no:cacheprovider
    -m
    not slow
pytest_add_cli_args_test_selection =
{tests}
"""


def scratch_copy(name: str) -> Path:
    """The working tree's files (tracked and new, not ignored) under a fresh folder of their own."""
    root = Path(tempfile.gettempdir()) / "shardtrain-automut" / name
    shutil.rmtree(root, ignore_errors=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for rel in filter(None, files):
        if (REPO / rel).is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, root / rel)
    return root


def run_module(name: str, show_survivors: bool) -> dict:
    module, tests = MODULES[name]
    root = scratch_copy(name)
    (root / "setup.cfg").write_text(SETUP_CFG.format(module=module, tests="\n".join(f"    {t}" for t in tests)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # mutmut puts mutants/ first itself
    subprocess.run([sys.executable, "-m", "mutmut", "run", "--max-children", "1"], cwd=root, env=env,
                   stdout=subprocess.DEVNULL)
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=root, env=env,
                         capture_output=True, text=True).stdout
    statuses = dict(re.findall(r"^\s+(\S+): (.+)$", out, re.M))
    counts = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    print(f"{name}: {len(statuses)} mutants, " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    for mutant, status in statuses.items():
        if status != "killed":
            print(f"  {status}: {mutant}")
            if show_survivors:
                print(subprocess.run([sys.executable, "-m", "mutmut", "show", mutant], cwd=root, env=env,
                                     capture_output=True, text=True).stdout)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated names from MODULES")
    parser.add_argument("--show-survivors", action="store_true", help="print each survivor's diff")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(MODULES)
    killed = total = 0
    for name in names:
        counts = run_module(name, args.show_survivors)
        killed += counts.get("killed", 0)
        total += sum(counts.values())
    print(f"RESULT automatic_mutation_killed={killed / max(total, 1):.3f} target>={TARGET}")


if __name__ == "__main__":
    main()
