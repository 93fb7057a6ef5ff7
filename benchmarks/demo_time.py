"""shard-demo's wall time on this machine, phase by phase (issues 18 and 31's target: at most 3 minutes on an
idle 2-core machine).

Runs ``shard-demo`` as a user would (a fresh work directory, default flags) in a subprocess and reads the
phase lines it prints (``== shard-demo: ...`` then ``== shard-demo: (N s)``). There is no baseline to divide
by: the target is a wall time a new user waits, so the RESULT is seconds; each phase is also shown as a fraction
of the wall time ("outside the phases": the interpreter's start and the imports). CPU seconds (user + sys of every
process) say how much of the wall time a busier machine would stretch.

    python benchmarks/demo_time.py [--keep DIR]
"""
import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time

TARGET_SECONDS = 180
PHASE = re.compile(r"^== shard-demo: (?:\((?P<took>[^)]*)\)|(?P<what>.*))$")


def seconds(text: str) -> float:
    minutes = re.search(r"(\d+) min", text)
    secs = re.search(r"(\d+) s", text)
    return (int(minutes.group(1)) * 60 if minutes else 0) + (int(secs.group(1)) if secs else 0)


def read_phases(stdout: str):
    """(what, seconds) of each phase, from the pair of lines the demo prints for it."""
    what = None
    for line in stdout.splitlines():
        match = PHASE.match(line)
        if match and match["what"] is not None and not match["what"].startswith("done in"):
            what = match["what"]
        elif match and match["took"] is not None and what is not None:
            yield what, seconds(match["took"])
            what = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", default=None, help="work directory to keep (default: a temporary one)")
    args = parser.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="shard-demo-bench-")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "shardtrain.cli.demo", "--workdir", f"{work}/w"],
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"shard-demo failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"{'phase':<78} seconds fraction")
    phases = list(read_phases(done.stdout))
    for what, took in phases + [("(outside the phases)", wall - sum(took for _, took in phases))]:
        print(f"{what[:78]:<78} {took:>7.0f} {took / wall:>8.2f}")
    print(f"wall {wall:.1f} s; CPU {usage.ru_utime + usage.ru_stime:.1f} s (user {usage.ru_utime:.1f}, "
          f"sys {usage.ru_stime:.1f}); wall / target {wall / TARGET_SECONDS:.2f}")
    print(f"RESULT demo_seconds={wall:.1f} target<={TARGET_SECONDS}")


if __name__ == "__main__":
    main()
