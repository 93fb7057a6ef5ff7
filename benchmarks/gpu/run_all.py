"""The GPU acceptance run, in tiers that each fit a GPU node's 10-minute command limit:

    python benchmarks/gpu/run_all.py --budget 480 --out DIR                                # tier 1
    python benchmarks/gpu/run_all.py --budget 480 --out DIR2 --tier 2 --resume DIR/results.json

Runs the cases of cases.py (every test of tests/gpu and every scenario of scenarios.py) in order,
each in its own process group killed at its timeout. A case whose estimate does not fit in what is
left of --budget (wall seconds since this script started) is not started; one that needs more GPUs
than are visible is listed as not run. --out receives results.json, results.md, junit.xml and run.log
(report.py), rewritten after every case. --resume reads an earlier results.json: the cases it holds a
verdict for (passed, failed, timeout, skipped, interrupted) are carried over, not run again, and the
run starts with those of tiers up to --tier that did not run (default: the first tier with any).

Exit status: 0 when every case this run started passed and met its targets (cases left over for the
budget, or for want of GPUs, are listed but are no failure); 1 when one failed, timed out, skipped a
test or missed a target; 2 for bad arguments, or when no CUDA device is visible (the files say so).
"""
import time

STARTED = time.monotonic()  # the budget counts from here, imports included
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from typing import Callable, Dict, List, Optional, Sequence  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import report  # noqa: E402
import runner  # noqa: E402
from cases import BUDGET_S, CASES, Case  # noqa: E402

BEGIN, END = "<!-- gpu-acceptance:begin -->", "<!-- gpu-acceptance:end -->"
PROBE = """import json, platform, torch
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(), "gpus": gpus}
if gpus:
    p = torch.cuda.get_device_properties(0)
    info.update(device=p.name, memory_gib=round(p.total_memory / 2**30, 1))
print(json.dumps(info))"""


class UsageError(Exception):
    pass


def parse_args(argv, tiers: Sequence[int]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="wall seconds for the whole run")
    parser.add_argument("--out", required=True, help="directory for the 4 result files")
    parser.add_argument("--tier", type=int, help=f"tier to run ({min(tiers)}-{max(tiers)}; default 1, or with "
                                                 "--resume the first with cases not run)")
    parser.add_argument("--resume", help="an earlier run's results.json: keep its verdicts, run the rest")
    parser.add_argument("--write-benchmarks", action="store_true",
                        help="also write results.md into BENCHMARKS.md's GPU section")
    args = parser.parse_args(argv)
    if args.budget <= 0:
        raise UsageError(f"--budget {args.budget:g}: the run's wall seconds must be > 0 (a node with a 10-minute "
                         "limit per command: --budget 480 leaves time for start-up and copying the results).")
    if args.tier is not None and args.tier not in tiers:
        raise UsageError(f"--tier {args.tier}: the catalogue has tiers {min(tiers)} to {max(tiers)} "
                         "(benchmarks/gpu/cases.py).")
    if os.path.isfile(args.out):
        raise UsageError(f"--out {args.out!r} is a file; pass a directory (created if missing).")
    return args


def load_previous(path: Optional[str]) -> Dict[str, Dict]:
    """An earlier results.json's case records by name; one still "running" was killed mid-case."""
    if not path:
        return {}
    try:
        with open(path) as f:
            cases = json.load(f)["cases"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--resume {path!r} cannot be read as a run_all.py results.json ({e}); pass the "
                         "results.json an earlier run wrote into its --out directory.") from None
    previous = {}
    for r in cases:
        if r.get("status") == "running":
            r.update(status="interrupted", reason="the run ended while this case ran (killed from outside?)")
        previous[r["name"]] = r
    return previous


def select(catalogue: Sequence[Case], tier: Optional[int], previous: Dict[str, Dict], gpus: int):
    """(tier, the cases to run in order): without --resume the tier's cases; with it, the cases of
    tiers up to it that hold no verdict, so what an earlier tier left over comes first."""
    todo = [c for c in catalogue if previous.get(c.name, {}).get("status") not in runner.VERDICTS]
    if tier is None:
        runnable = [c.tier for c in todo if c.gpus <= gpus]
        tier = (min(runnable) if runnable else max(c.tier for c in catalogue)) if previous else 1
    return tier, [c for c in todo if (c.tier <= tier if previous else c.tier == tier)]


def records_for(catalogue: Sequence[Case], previous: Dict[str, Dict], selected: Sequence[Case],
                gpus: int) -> List[Dict]:
    """A record per case of the catalogue: carried from --resume, to run now, or not run and why."""
    chosen = {c.name for c in selected}
    out = []
    for c in catalogue:
        base = {"name": c.name, "tier": c.tier, "gpus": c.gpus, "node_ids": list(c.tests), "scenario": c.scenario,
                "estimate_s": c.estimate_s, "basis": c.basis, "timeout_s": c.timeout_s}
        if c.name in previous and c.name not in chosen:
            out.append({**previous[c.name], **base, "carried": True, "this_run": False})
        elif c.gpus > gpus:
            out.append({**base, "status": "not run", "reason": runner.needs(c.gpus, gpus),
                        "this_run": c.name in chosen})
        else:
            out.append({**base, "status": "not run", "reason": "queued" if c.name in chosen else f"tier {c.tier}",
                        "this_run": c.name in chosen})
    return out


def probe_environment() -> Dict:
    """What the node is, from a separate Python (this process never touches CUDA) and nvidia-smi."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    info = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {
        "gpus": 0, "error": done.stderr[-500:]}
    info["driver"] = _driver_version()
    info["commit"] = _git(["rev-parse", "--short", "HEAD"])
    info["cpus"] = os.cpu_count()
    return info


def _driver_version() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.split()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        with open("/proc/driver/nvidia/version") as f:
            found = re.search(r"Kernel Module\s+([\d.]+)", f.read())
        return found.group(1) if found else "unknown"
    except OSError:
        return "unknown"


def _git(args: List[str]) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
        return done.stdout.strip() if done.returncode == 0 else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def child_env() -> Dict[str, str]:
    """This checkout first on PYTHONPATH (it wins over an installed shardtrain), output unbuffered."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


def write_section(text: str, root: Optional[str] = None) -> None:
    """Replace (or add) the GPU section of BENCHMARKS.md: safe to run twice."""
    path = os.path.join(root or ROOT, "BENCHMARKS.md")
    with open(path) as f:
        doc = f.read()
    section = f"{BEGIN}\n{text.rstrip()}\n{END}"
    doc = (re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: section, doc, flags=re.S)
           if BEGIN in doc else doc.rstrip("\n") + "\n\n" + section + "\n")
    report._replace(path, doc)


def main(argv=None, catalogue: Sequence[Case] = CASES, run_case: Optional[Callable] = None,
         probe: Callable[[], Dict] = probe_environment, clock: Callable[[], float] = time.monotonic,
         start: Optional[float] = None) -> int:
    """``run_case``: a stand-in for runner.run_case (tests; no GPU needed, exit 2 is not taken)."""
    start = STARTED if start is None else start
    try:
        args = parse_args(argv, sorted({c.tier for c in catalogue}))
        previous = load_previous(args.resume)
    except UsageError as e:
        print(f"run_all.py: error: {e}", file=sys.stderr)
        return 2
    env = probe()
    gpus = env.get("gpus", 0)
    tier, selected = select(catalogue, args.tier, previous, gpus)
    state = {"command": " ".join(["python benchmarks/gpu/run_all.py", *(argv if argv is not None else sys.argv[1:])]),
             "started": report.now(), "budget_s": args.budget, "tier": tier, "resumed_from": args.resume,
             "environment": env, "elapsed_s": 0.0, "finished": False,
             "cases": records_for(catalogue, previous, selected, gpus)}
    os.makedirs(args.out, exist_ok=True)
    no_cuda = run_case is None and gpus == 0
    if no_cuda:
        for r in (r for r in state["cases"] if r.get("this_run")):
            r.update(status="not run", reason="no CUDA device is visible")
        selected = []
    workdir = tempfile.mkdtemp(prefix="shardtrain-gpu-acceptance-")
    with open(os.path.join(args.out, "run.log"), "ab") as log:
        runner._log(log, f"==== {state['command']} at {state['started']}: {json.dumps(env)}")
        ctx = runner.Context(workdir, log, child_env())

        def saved():
            state["elapsed_s"] = round(clock() - start, 1)
            report.write(args.out, state)

        records = {r["name"]: r for r in state["cases"]}
        runner.run_cases(selected, records, args.budget, gpus, clock, start, run_case or runner.run_case, ctx, saved)
        state["finished"] = True
        saved()
    shutil.rmtree(workdir, ignore_errors=True)
    return finish(state, args, no_cuda)


def finish(state: Dict, args, no_cuda: bool) -> int:
    text = report.markdown(state)
    print(text)
    if args.write_benchmarks:
        write_section(text)
    if no_cuda:
        print("run_all.py: error: no CUDA device is visible (torch.cuda.is_available() is False in this Python); "
              "run it on a GPU node with a CUDA build of torch. The results files list every case as not run.",
              file=sys.stderr)
        return 2
    return 1 if state["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
