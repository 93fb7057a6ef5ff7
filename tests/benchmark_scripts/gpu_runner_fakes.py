"""The stand-ins tests/benchmark_scripts/test_gpu_acceptance_runner.py and test_gpu_runner_faults.py drive
benchmarks/gpu/run_all.py with: a one-GPU machine, a fake catalogue and clock, a case runner that runs nothing."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gpu"))
import run_all  # noqa: E402
import runner  # noqa: E402
from cases import Case  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONE_GPU = {"gpus": 1, "device": "NVIDIA H100 80GB HBM3", "driver": "570.86.15", "torch": "2.11.0+cu130",
           "python": "3.12.3", "cuda": "13.0"}
FAKE = [Case("a", 1, 30, "fake", ("tests/gpu/test_a.py",)), Case("b", 1, 50, "fake", scenario="b"),
        Case("c", 1, 20, "fake", ("tests/gpu/test_c.py",)), Case("d", 1, 5, "fake", ("tests/gpu/test_d.py",)),
        Case("two", 2, 10, "fake", ("tests/gpu/test_two.py",), gpus=2), Case("e", 2, 10, "fake", scenario="e"),
        Case("f", 3, 10, "fake", scenario="f")]
TAKES = {"a": 40, "b": 50, "c": 1, "d": 5, "two": 10, "e": 10, "f": 10}  # seconds on the fake clock


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def stand_in(clock, seen, fail=(), results=None):
    """Runs nothing: advances the clock by the case's time (or to its timeout), returns its outcome."""
    def run(case, timeout_s, ctx):
        seen.append(case.name)
        took = TAKES[case.name]
        clock.now += min(took, timeout_s)
        if took > timeout_s:
            return runner.Outcome("timeout", timeout_s, "killed")
        status = "failed" if case.name in fail else "passed"
        return runner.Outcome(status, took, results=(results or {}).get(case.name, [["speed", 2.5, ">=1"]]))
    return run


def main(args, clock, seen, env=ONE_GPU, catalogue=FAKE, **kwargs):
    return run_all.main(args, catalogue=catalogue, run_case=stand_in(clock, seen, **kwargs), probe=lambda: dict(env),
                        clock=clock, start=clock.now)


def statuses(out):
    with open(os.path.join(out, "results.json")) as f:
        return {r["name"]: (r["status"], r["reason"]) for r in json.load(f)["cases"]}
