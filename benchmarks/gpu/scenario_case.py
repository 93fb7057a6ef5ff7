"""One GPU scenario in its own process, so ``run_all.py`` can kill it at its timeout:

    python benchmarks/gpu/scenario_case.py NAME WORKDIR OUT_JSON

Writes ``{"rows": [...], "results": [[name, value, target], ...]}`` to OUT_JSON and prints the
rows and ``RESULT`` lines; exits 1 (with the traceback) when a run fails or an assertion does not hold.
"""
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from runs import learnable_data_bin  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402


def result_line(name: str, value: float, target: str) -> str:
    return f"RESULT {name}={value:.4g}" + (f" target{target}" if target else "")


def main(argv) -> int:
    name, workdir, out = argv
    os.makedirs(workdir, exist_ok=True)
    data_bin = learnable_data_bin(os.path.join(workdir, "data-bin"))  # made once per run_all workdir
    try:
        rows, results = SCENARIOS[name](data_bin, workdir)
    except Exception:  # noqa: BLE001 - the traceback is the case's report; run_all records the exit code
        traceback.print_exc()
        return 1
    for row in rows:
        print(" | ".join(f"{k}: {v}" for k, v in row.items()))
    for result in results:
        print(result_line(*result))
    with open(out, "w") as f:
        json.dump({"rows": rows, "results": [list(r) for r in results]}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
