"""How long the test suite takes: the fast tier (what a developer runs after each edit) and the whole suite
(README's test command, what CI runs first), each with the load average beside it.

    python benchmarks/suite_time.py [--fast-only] [--pytest-args "..."]

Both run exactly as a user types them (``python -m pytest -q -n auto tests`` and ``... -m "not slow"``: README's
command, spread over the cores by pytest-xdist; ``--pytest-args "-n 0"`` times one process), from the
repository root, one after the other (never side by side: each is timed on the cores it would have alone).
A suite that fails still gets its time, and the exit status says it failed. The load average is read before
and after each run; a figure begun with the 1-minute load above the core count is not an idle figure, and
the line says so. The last lines are

    RESULT fast_tier_seconds=<s> target<=180
    RESULT suite_minutes=<min> target<=15
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST_TARGET_S = 180.0
SUITE_TARGET_MIN = 15.0


def run(marker_args, extra):
    """(seconds, pytest's last line, exit status, load before, load after) of one pytest run."""
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "auto", "tests", *marker_args, *extra]
    load_before = os.getloadavg()[0]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    seconds = time.monotonic() - start
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line)), "no summary")
    return seconds, summary.strip("= "), proc.returncode, load_before, os.getloadavg()[0]


def report(name, seconds, summary, rc, before, after):
    cores = len(os.sched_getaffinity(0))
    # the load before the run says whether something else was running: the one after counts the run's own workers
    # and the ranks they spawn (5.5 on 2 cores at the end of the whole suite with -n auto)
    idle = "idle" if before <= cores else f"LOADED: above {cores} cores before it started, not an idle figure"
    print(f"{name}: {seconds:.1f} s ({seconds / 60:.2f} min), {summary}, exit {rc}; load average "
          f"{before:.2f} before, {after:.2f} after ({idle})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fast-only", action="store_true", help="time the fast tier only")
    parser.add_argument("--pytest-args", default="", help="more arguments for both runs (e.g. -p no:cacheprovider)")
    args = parser.parse_args()
    extra = shlex.split(args.pytest_args)
    failed = False
    fast = run(["-m", "not slow"], extra)
    report("fast tier (-m 'not slow')", *fast)
    failed |= fast[2] != 0
    results = [f"RESULT fast_tier_seconds={fast[0]:.1f} target<={FAST_TARGET_S:.0f}"]
    if not args.fast_only:
        whole = run([], extra)
        report("whole suite", *whole)
        failed |= whole[2] != 0
        results.append(f"RESULT suite_minutes={whole[0] / 60:.2f} target<={SUITE_TARGET_MIN:.0f}")
    print("\n".join(results))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
