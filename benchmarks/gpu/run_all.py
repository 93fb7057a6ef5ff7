"""The GPU acceptance run: ``python benchmarks/gpu/run_all.py`` on a machine with 1+ GPUs.

1. ``pytest tests/gpu`` (every GPU case; on 2+ GPUs the multi-GPU ones too);
2. the benchmark scenarios of ``scenarios.py`` (fairseq's offload recipe scaled to
   the card at --update-freq 1 and 4, MFU of a 1.3B bf16 model, fp16 vs bf16 on
   125M), each through the real CLI;
3. a table and ``RESULT`` lines, also written into the GPU section of
   BENCHMARKS.md with the device name (replacing that section: safe to run twice).

Meant to finish within 30 minutes on one H100-class GPU. Exits 1 if a test or a
scenario failed or a target was missed, 2 without CUDA.

    python benchmarks/gpu/run_all.py [--scenarios headline,mfu,precision] [--skip-tests] [--no-write]
"""
import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from runs import RunFailed, learnable_data_bin  # noqa: E402
from scenarios import SCENARIOS  # noqa: E402

BEGIN, END = "<!-- gpu-acceptance:begin -->", "<!-- gpu-acceptance:end -->"


def run_tests() -> dict:
    start = time.time()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfEs", "tests/gpu"], cwd=ROOT,
                          capture_output=True, text=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}
    failures = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"summary": summary, "counts": counts, "failures": failures, "seconds": time.time() - start,
            "ok": done.returncode == 0}


def met(value: float, target: str) -> bool:
    op, bound = target[:2], float(target[2:])
    return value <= bound if op == "<=" else value >= bound


def table(rows) -> str:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(row.get(k, "")) for k in keys) + " |" for row in rows]
    return "\n".join(lines)


def write_section(text: str) -> None:
    path = os.path.join(ROOT, "BENCHMARKS.md")
    with open(path) as f:
        doc = f.read()
    section = f"{BEGIN}\n{text}\n{END}"
    doc = (re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: section, doc, flags=re.S)
           if BEGIN in doc else doc.rstrip("\n") + "\n\n" + section + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(doc)
    os.replace(tmp, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "shardtrain-gpu-acceptance"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("run_all.py: error: no CUDA device is visible; run it on a GPU machine.", file=sys.stderr)
        return 2
    device = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    print(f"device: {device}, torch {torch.__version__}", flush=True)
    os.makedirs(args.workdir, exist_ok=True)
    start, rows, results, problems = time.time(), [], [], []
    if not args.skip_tests:
        tests = run_tests()
        print(f"tests/gpu: {tests['summary']} ({tests['seconds']:.0f} s)", flush=True)
        problems += tests["failures"] or ([] if tests["ok"] else [f"tests/gpu: {tests['summary']}"])
        results.append(("gpu_tests_failed", float(tests["counts"].get("failed", 0) + tests["counts"].get("error", 0)),
                        "<=0"))
    data_bin = learnable_data_bin(os.path.join(args.workdir, "data-bin"))
    for name in args.scenarios.split(","):
        began = time.time()
        try:
            new_rows, new_results = SCENARIOS[name](data_bin, args.workdir)
            rows += new_rows
            results += new_results
        except (RunFailed, AssertionError, subprocess.TimeoutExpired) as e:
            problems.append(f"scenario {name}: {type(e).__name__}: {str(e)[-1500:]}")
            traceback.print_exc()
        print(f"scenario {name}: {time.time() - began:.0f} s", flush=True)
    missed = [f"{n}={v:.3g} target{t}" for n, v, t in results if not met(v, t)]
    lines = [f"RESULT {n}={v:.3f} target{t}" for n, v, t in results]
    text = "\n".join([
        f"## GPU acceptance ({device})", "",
        f"    python benchmarks/gpu/run_all.py    # {datetime.date.today()}, {time.time() - start:.0f} s", "",
        table(rows) if rows else "(no scenario finished)", "", "    " + "\n    ".join(lines or ["(no results)"]), "",
        "Failures and missed targets: " + ("; ".join(problems + missed) if problems or missed else "none")])
    print(text)
    if not args.no_write:
        write_section(text)
    return 1 if problems or missed else 0


if __name__ == "__main__":
    sys.exit(main())
