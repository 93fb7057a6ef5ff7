"""How long a new user waits for a command to answer (issue 31, item 7).

* ``shard-train --help``, cold (an empty help cache: the text is built, torch imported) and warm (the
  same command again: answered from the cache, shardtrain/cli/help_cache.py). The RESULT is the warm
  figure, the one every --help after the first gets; the cold one is printed beside it.
* ``python -c "import torch"`` in the same run, the floor of any command that imports torch: each time
  is printed as a ratio to it, so figures from a loaded machine can be read against an idle one.
* the first line of every console command (run with no arguments, or ``--help`` where none is an
  error after a long import): the seconds until it prints anything, on stdout or stderr.

    python benchmarks/cli_start.py [--commands shard-train,shard-validate] [--repeat 3]

Each figure is the best of ``--repeat`` runs (the machine's noise only adds).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from shardtrain.cli.entry import COMMANDS  # noqa: E402 - after the repository is on the path

TARGET_HELP_S = 1.5
TARGET_FIRST_LINE_S = 2.0


def _entry_script(prog: str) -> str:
    fn = prog.replace("-", "_")
    return f"from shardtrain.cli.entry import {fn}; import sys; sys.argv[0] = {prog!r}; sys.exit({fn}())"


def _env(cache: str):
    return dict(os.environ, PYTHONPATH=REPO, SHARDTRAIN_CACHE_DIR=cache, COLUMNS="100")


def timed(argv, env) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - started


def first_output(argv, env) -> float:
    """Seconds until the process writes its first byte to stdout or stderr (both piped, as in a log)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc.stdout.read(1)
    seconds = time.perf_counter() - started
    proc.kill()
    proc.wait()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated console commands")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        torch_s = min(timed([sys.executable, "-c", "import torch"], _env(tmp)) for _ in range(args.repeat))
        help_argv = [sys.executable, "-c", _entry_script("shard-train"), "--help"]
        cold = []
        for i in range(args.repeat):
            cold.append(timed(help_argv, _env(os.path.join(tmp, f"cold{i}"))))
        warm = min(timed(help_argv, _env(os.path.join(tmp, "cold0"))) for _ in range(args.repeat))
        print(f"import torch: {torch_s:.2f} s")
        print(f"shard-train --help cold: {min(cold):.2f} s ({min(cold) / torch_s:.2f}x import torch)")
        print(f"shard-train --help warm: {warm:.2f} s ({warm / torch_s:.2f}x import torch)")
        worst = 0.0
        for prog in args.commands.split(","):
            argv = [sys.executable, "-c", _entry_script(prog)]
            first = min(first_output(argv, _env(os.path.join(tmp, "first"))) for _ in range(args.repeat))
            worst = max(worst, first)
            print(f"{prog}: first line after {first:.2f} s ({first / torch_s:.2f}x import torch)")
    print(f"RESULT first_line_seconds_worst={worst:.2f} target<={TARGET_FIRST_LINE_S}")
    print(f"RESULT help_seconds={warm:.2f} target<={TARGET_HELP_S}")


if __name__ == "__main__":
    main()
