"""The GPU acceptance run, in tiers that each fit a GPU node's 10-minute command limit:

    python benchmarks/gpu/run_all.py --budget 480 --out DIR                                # tier 1
    python benchmarks/gpu/run_all.py --budget 480 --out DIR2 --tier 2 --resume DIR/results.json

Runs the cases of cases.py (every test of tests/gpu and every scenario of scenarios.py) in order,
each in its own process group killed at its timeout. A case whose estimate does not fit in what is
left of --budget (wall seconds since main() started) is not started; one that needs more GPUs
than are visible is listed as not run. --out receives results.json, results.md, junit.xml and run.log
(report.py), rewritten after every case. --resume reads an earlier results.json: the cases it holds a
verdict for (passed, failed, timeout, skipped) are carried over, not run again, and the run starts
with those of tiers up to --tier that did not run (default: the first tier with any); a case that was
interrupted (the run was killed while it ran) or stopped (the budget ended while it ran) is run again.

SIGTERM, SIGINT or SIGHUP (a node's command limit, Ctrl-C) kill the running case's process group,
record it as interrupted, write the results and exit 128 + the signal's number.

Exit status: 0 when every case this run started passed and met its targets (cases left over for the
budget, or for want of GPUs, are listed but are no failure); 1 when one failed, timed out, skipped a
test, missed a target or was stopped at the budget's end (status "stopped": started, killed when the
budget ran out, run again by --resume); 2 for bad arguments, or when no CUDA device is visible (the files say so).

On a node without .git the commit comes from benchmarks/gpu/COMMIT, which
`python benchmarks/gpu/stamp_commit.py` writes in the checkout before it is copied.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import report  # noqa: E402
import runner  # noqa: E402
import stamp_commit  # noqa: E402
from cases import BUDGET_S, CASES, Case  # noqa: E402

BEGIN, END = "<!-- gpu-acceptance:begin -->", "<!-- gpu-acceptance:end -->"
PROBE = """import json, platform, torch
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(), "gpus": gpus}
if gpus:
    p = torch.cuda.get_device_properties(0)
    info.update(device=p.name, memory_gib=round(p.total_memory / 2**30, 1))
print(json.dumps(info))"""
PROBE_TIMEOUT_S = 120  # a CUDA init that takes longer is a broken node: recorded, not waited on
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


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
    if not (math.isfinite(args.budget) and args.budget > 0):  # nan > 0 is False, but so is nan <= 0
        raise UsageError(f"--budget {args.budget:g}: the run's wall seconds must be a finite number > 0 (a node "
                         "with a 10-minute limit per command: --budget 480 leaves time for start-up and copying "
                         "the results).")
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
        problem = _malformed(cases)
    except (OSError, ValueError, KeyError, TypeError) as e:
        problem = f"{type(e).__name__}: {e}"
    if problem:
        raise UsageError(f"--resume {path!r} cannot be read as a run_all.py results.json ({problem}); pass the "
                         "results.json an earlier run wrote into its --out directory.")
    previous = {}
    for r in cases:
        if r.get("status") == "running":
            r.update(status="interrupted", reason="the run ended while this case ran (killed from outside?)")
        previous[r["name"]] = r
    return previous


def _malformed(cases) -> str:
    """What keeps ``cases`` from being a results.json's case records ("" when nothing)."""
    if not isinstance(cases, list):
        return f"its \"cases\" is a {type(cases).__name__}, not a list of case records"
    for i, r in enumerate(cases):
        if not (isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("status", ""), str)):
            return f"case record {i} has no name and status: {json.dumps(r)[:80]}"
    return ""


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
    """What the node is, from a separate Python (this process never touches CUDA) and nvidia-smi.
    A probe that hangs or fails is recorded in "error" (0 GPUs): the results say why nothing ran."""
    try:
        done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
        info = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {
            "gpus": 0, "error": f"the device probe exited {done.returncode}: {done.stderr[-500:]}"}
    except subprocess.TimeoutExpired:
        info = {"gpus": 0, "error": f"the device probe (a Python that imports torch and counts the GPUs) timed out "
                                    f"after {PROBE_TIMEOUT_S} s: a hung driver or GPU?"}
    except (ValueError, IndexError) as e:
        info = {"gpus": 0, "error": f"the device probe printed no JSON ({e})"}
    info["driver"] = _driver_version()
    info["commit"] = stamp_commit.commit(ROOT)
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


class Interrupted(BaseException):
    """A signal from outside: not an Exception, so no case runner's ``except Exception`` swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum, frame):
    raise Interrupted(signum)


def open_log(out: str):
    """--out's run.log, opened before the probe: a directory that cannot be written is said at once."""
    try:
        os.makedirs(out, exist_ok=True)
        return open(os.path.join(out, "run.log"), "ab")
    except OSError as e:
        raise UsageError(f"--out {out!r} cannot be written ({e.strerror or e}); pass a directory you can write "
                         "(created if missing).") from None


def main(argv=None, catalogue: Sequence[Case] = CASES, run_case: Optional[Callable] = None,
         probe: Callable[[], Dict] = probe_environment, clock: Callable[[], float] = time.monotonic,
         start: Optional[float] = None) -> int:
    """``run_case``: a stand-in for runner.run_case (tests; no GPU needed, exit 2 is not taken)."""
    start = clock() if start is None else start  # not at import: pytest imports this module long before
    try:
        args = parse_args(argv, sorted({c.tier for c in catalogue}))
        previous = load_previous(args.resume)
        log = open_log(args.out)
    except UsageError as e:
        print(f"run_all.py: error: {e}", file=sys.stderr)
        return 2
    handlers = {s: signal.signal(s, _interrupt) for s in SIGNALS}
    try:
        with log:
            return run(args, argv, previous, catalogue, run_case, probe, clock, start, log)
    except Interrupted as e:  # during the probe, before there were results to write
        print(f"run_all.py: error: stopped by {signal.Signals(e.signum).name} before any case ran.", file=sys.stderr)
        return 128 + e.signum
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def run(args, argv, previous, catalogue, run_case, probe, clock, start, log) -> int:
    env = probe()
    gpus = env.get("gpus", 0)
    tier, selected = select(catalogue, args.tier, previous, gpus)
    state = {"command": " ".join(["python benchmarks/gpu/run_all.py", *(argv if argv is not None else sys.argv[1:])]),
             "started": report.now(), "budget_s": args.budget, "tier": tier, "resumed_from": args.resume,
             "environment": env, "elapsed_s": 0.0, "finished": False,
             "cases": records_for(catalogue, previous, selected, gpus)}
    no_cuda = run_case is None and gpus == 0
    if no_cuda:
        for r in (r for r in state["cases"] if r.get("this_run")):
            r.update(status="not run", reason=env.get("error") or "no CUDA device is visible")
        selected = []
    workdir = tempfile.mkdtemp(prefix="shardtrain-gpu-acceptance-")

    def saved():
        state["elapsed_s"] = round(clock() - start, 1)
        report.write(args.out, state)

    try:
        runner._log(log, f"==== {state['command']} at {state['started']}: {json.dumps(env)}")
        records = {r["name"]: r for r in state["cases"]}
        runner.run_cases(selected, records, args.budget, gpus, clock, start, run_case or runner.run_case,
                         runner.Context(workdir, log, child_env()), saved)
        state["finished"] = True
        saved()
    except Interrupted as e:
        return interrupted(state, e.signum, saved)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return finish(state, args, no_cuda)


def interrupted(state: Dict, signum: int, saved: Callable[[], None]) -> int:
    """The running case's process group is gone (runner.run_process ends it as the signal unwinds it)."""
    for s in SIGNALS:  # a second signal must not cut the results short
        signal.signal(s, signal.SIG_IGN)
    name = signal.Signals(signum).name
    for r in (r for r in state["cases"] if r["status"] == "running"):
        r.update(status="interrupted", reason=f"run_all.py got {name} while this case ran; its process group "
                                              "was killed (--resume runs it again)")
    state["interrupted"] = name
    saved()
    print(f"run_all.py: error: stopped by {name}; the results files hold what ran (--resume continues).",
          file=sys.stderr)
    return 128 + signum


def finish(state: Dict, args, no_cuda: bool) -> int:
    text = report.markdown(state)
    print(text)
    if args.write_benchmarks:
        write_section(text)
    if no_cuda:
        why = state["environment"].get("error") or "torch.cuda.is_available() is False in this Python"
        print(f"run_all.py: error: no CUDA device is visible ({why}); run it on a GPU node with a CUDA build of "
              "torch. The results files list every case as not run.", file=sys.stderr)
        return 2
    return 1 if state["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
