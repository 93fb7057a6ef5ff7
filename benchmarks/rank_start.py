"""What a 2-rank CPU shard-train costs when its ranks are forked from a forkserver (shardtrain/trainer/launch/
start_method.py) against spawned, the way every launcher starts them by default (torch.multiprocessing.spawn).

The same command both ways, rounds alternating: a tiny model, 5 updates, fully_sharded on 2 gloo ranks, no save.
The baseline is the same shard-train with ``start_method.rank_start`` replaced by one that always says "spawn".
CPU is the whole machine's busy time over the command (/proc/stat: a forked rank ends with os._exit, so no
per-process accounting sees it); run it on an otherwise idle machine.

    python benchmarks/rank_start.py [--rounds 3]

RESULT: the forked run's CPU over the spawned run's (medians). Target <= 0.8: one torch import for all ranks
instead of one each saves a third of such a run's CPU on this machine.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from make_data import random_data_bin  # noqa: E402

SPAWN = ("import contextlib, runpy, sys\n"
         "from shardtrain.trainer.launch import start_method\n"
         "start_method.rank_start = lambda use_cuda, main: contextlib.nullcontext('spawn')\n"
         "sys.argv[0] = 'shard-train'\n"
         "runpy.run_module('shardtrain.cli.train', run_name='__main__')\n")
FORK = SPAWN.replace("start_method.rank_start = lambda use_cuda, main: contextlib.nullcontext('spawn')\n", "")
FLAGS = ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim",
         "64", "--decoder-attention-heads", "2", "--tokens-per-sample", "32", "--batch-size", "4", "--max-update", "5",
         "--cpu", "--threads", "1", "--distributed-world-size", "2", "--ddp-backend", "fully_sharded", "--no-save",
         "--disable-validation", "--log-format", "none"]


def _busy_seconds() -> float:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / ticks  # user nice system irq softirq


def run(script: str, data: str) -> tuple:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    busy, started = _busy_seconds(), time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script, data, *FLAGS], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    time.sleep(0.5)  # the forkserver's last exit
    if done.returncode != 0:
        raise SystemExit(f"shard-train failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return _busy_seconds() - busy, wall, done.stderr


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = random_data_bin(os.path.join(tmp, "data"), vocab=200, lines=50, line_len=100)
        figures = {"spawned": [], "forked": []}
        for _ in range(args.rounds):
            for name, script in (("spawned", SPAWN), ("forked", FORK)):
                cpu, wall, err = run(script, data)
                said = "forked from it" in err
                assert said == (name == "forked"), f"{name} run's start line: {err[:500]}"
                figures[name].append((cpu, wall))
                print(f"{name:8} cpu {cpu:6.2f} s  wall {wall:6.2f} s", flush=True)
    med = {name: (statistics.median(c for c, _ in rows), statistics.median(w for _, w in rows))
           for name, rows in figures.items()}
    for name, (cpu, wall) in med.items():
        print(f"median {name:8} cpu {cpu:6.2f} s  wall {wall:6.2f} s")
    print(f"forked/spawned: cpu {med['forked'][0] / med['spawned'][0]:.3f}, wall {med['forked'][1] / med['spawned'][1]:.3f}")
    print(f"RESULT rank_start_cpu_ratio={med['forked'][0] / med['spawned'][0]:.3f} target<=0.8")


if __name__ == "__main__":
    main()
