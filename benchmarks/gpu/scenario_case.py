"""One GPU scenario in its own process, so ``run_all.py`` can kill it at its timeout:

    python benchmarks/gpu/scenario_case.py NAME WORKDIR OUT_JSON

As each of the scenario's runs finishes, prints its rows and ``RESULT`` lines (into run_all.py's run.log)
and rewrites OUT_JSON, ``{"rows": [...], "results": [[name, value, target], ...], "finished": bool}``, with
everything so far: a scenario killed at its timeout, or failing in its second run, keeps the first run's
figures (issue 45, 2.5). Exits 1 (with the traceback) when a run fails or an assertion does not hold.
"""
import json
import os
import sys
import traceback
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from runs import learnable_data_bin  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402


def result_line(name: str, value: float, target: str) -> str:
    return f"RESULT {name}={value:.4g}" + (f" target{target}" if target else "")


class Sink:
    """What the scenario emitted so far, on disk after every run (written whole: it may be killed at any moment)."""

    def __init__(self, out: str):
        self.out, self.rows, self.results = out, [], []

    def __call__(self, rows: List[Dict], results: List) -> None:
        for row in rows:
            print(" | ".join(f"{k}: {v}" for k, v in row.items()), flush=True)
        for result in results:
            print(result_line(*result), flush=True)
        self.rows += rows
        self.results += [list(r) for r in results]
        self.write(finished=False)

    def write(self, finished: bool) -> None:
        with open(self.out + ".tmp", "w") as f:
            json.dump({"rows": self.rows, "results": self.results, "finished": finished}, f)
        os.replace(self.out + ".tmp", self.out)


def main(argv) -> int:
    name, workdir, out = argv
    os.makedirs(workdir, exist_ok=True)
    data_bin = learnable_data_bin(os.path.join(workdir, "data-bin"))  # made once per run_all workdir
    sink = Sink(out)
    try:
        SCENARIOS[name](data_bin, workdir, sink)
    except Exception:  # noqa: BLE001 - the traceback is the case's report; run_all records the exit code
        traceback.print_exc()
        return 1
    sink.write(finished=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
