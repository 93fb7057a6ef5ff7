"""Running the catalogue's cases inside a wall-clock budget, each in its own process group.

``run_cases`` decides (what fits, what this node can run) and records; the work is done by a
``run_case(case, timeout_s, ctx) -> Outcome`` function: ``run_case`` here runs pytest or
``scenario_case.py`` as subprocesses; tests pass a stand-in that needs no GPU.
"""
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from typing import Callable, Dict, List, Optional

from cases import Case

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# Statuses a resumed run does not run again: the case ran and has its verdict ("interrupted": the run
# was killed while it ran; "stopped": the budget ended while it ran; neither says anything of the case,
# so --resume runs it again, and both are problems: the run did not do what it was asked).
VERDICTS = ("passed", "failed", "timeout", "skipped")
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| ")  # shardtrain's log format: not a figure


@dataclasses.dataclass
class Outcome:
    status: str  # passed, failed, timeout, skipped (a test skipped itself: this node is not as expected)
    seconds: float
    reason: str = ""
    tests: List[Dict] = dataclasses.field(default_factory=list)  # per test: id, outcome, seconds, message
    figures: List[str] = dataclasses.field(default_factory=list)  # lines the tests printed
    results: List[List] = dataclasses.field(default_factory=list)  # [name, value, target ("": a figure)]
    rows: List[Dict] = dataclasses.field(default_factory=list)  # a scenario's table rows
    junit: Optional[ET.Element] = None  # pytest's <testsuite>


@dataclasses.dataclass
class Context:
    workdir: str
    log: object  # the full log, opened for appending in binary mode
    env: Dict[str, str]


def run_process(argv: List[str], log, timeout_s: float, env: Optional[Dict[str, str]] = None) -> Optional[int]:
    """Run ``argv`` in its own process group with its output appended to ``log``; at ``timeout_s``
    kill the whole group (pytest's training subprocesses and their ranks too). None: timed out."""
    log.flush()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=grace)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        return None
    finally:
        _end_group(proc.pid)


def _end_group(pgid: int) -> None:
    """Whatever the case left running in its group (a stuck rank) must not hold the GPU for the next."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _log_size(log) -> int:
    """The log's length on disk (the children append to the same file: our own position is no guide)."""
    log.flush()
    return os.path.getsize(log.name)


def _output_since(log, offset: int) -> str:
    log.flush()
    with open(log.name, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", "replace")


RESULT_LINE = re.compile(r"^RESULT ([^=\s]+)(?:=|\s+)(\S+)(?:\s+target(\S+))?")  # also "RESULT name value"


def parse_results(text: str) -> List[List]:
    """The ``RESULT name=value [target<=x]`` lines of ``text`` as [name, value, target]."""
    found = [RESULT_LINE.match(line.strip()) for line in text.splitlines()]
    return [[m.group(1), _number(m.group(2)), m.group(3) or ""] for m in found if m]


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def run_pytest_case(case: Case, timeout_s: float, ctx: Context) -> Outcome:
    junit = os.path.join(ctx.workdir, "junit", case.name + ".xml")
    basetemp = os.path.join(ctx.workdir, "pytest", case.name)
    # pytest creates --basetemp itself but not its parent (the first GPU run failed every tmp_path test on it)
    os.makedirs(os.path.dirname(basetemp), exist_ok=True)
    argv = [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "--basetemp", basetemp,
            "--junitxml", junit, "-o", "junit_logging=system-out", "-o", f"junit_suite_name={case.name}",
            *case.tests]
    start, offset = time.monotonic(), _log_size(ctx.log)
    code = run_process(argv, ctx.log, timeout_s, ctx.env)
    seconds = time.monotonic() - start
    shutil.rmtree(basetemp, ignore_errors=True)  # checkpoints: the node's disk is shared by all tiers' cases
    try:
        outcome = _read_junit(junit)
    except (OSError, ET.ParseError) as e:  # killed before (or while) writing it
        outcome = Outcome("failed", 0.0, f"no readable junit XML from pytest ({e})")
    outcome.seconds = seconds
    # RESULT lines: captured (in the junit XML) from passing tests, in the log from failing ones and -s
    outcome.results += [r for r in parse_results(_output_since(ctx.log, offset)) if r not in outcome.results]
    if code is None:
        outcome.status, outcome.reason = "timeout", f"killed at its {timeout_s:.0f} s timeout"
    elif code != 0 and outcome.status == "passed":
        outcome.status, outcome.reason = "failed", f"pytest exited {code}"
    return outcome


def _read_junit(path: str) -> Outcome:
    """Each test's outcome, the lines it printed (not log records) and its RESULT lines."""
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests: List[Dict] = []
    printed: List[str] = []
    for tc in suite.iter("testcase"):
        bad = next((tc.find(k) for k in ("failure", "error", "skipped") if tc.find(k) is not None), None)
        tests.append({"id": f"{tc.get('classname', '').replace('.', '/')}.py::{tc.get('name')}",
                      "outcome": "passed" if bad is None else bad.tag, "seconds": float(tc.get("time", 0)),
                      "message": "" if bad is None else (bad.get("message") or "")[:500]})
        out = tc.find("system-out")
        printed += (out.text or "").splitlines() if out is not None else []
    figures = [line for line in printed if line.strip() and not LOG_RECORD.match(line)
               and not line.startswith(("-----", "RESULT "))]
    outcomes = {t["outcome"] for t in tests}
    status = "failed" if outcomes & {"failure", "error"} or not tests else \
        "skipped" if "skipped" in outcomes else "passed"
    reason = "; ".join(f"{t['id']}: {t['outcome']} {t['message']}"[:300] for t in tests if t["outcome"] != "passed")
    return Outcome(status, 0.0, reason or ("" if tests else "no test ran"), tests, figures[:50],
                   parse_results("\n".join(printed)), junit=suite)


def run_scenario_case(case: Case, timeout_s: float, ctx: Context) -> Outcome:
    out = os.path.join(ctx.workdir, f"{case.name}.json")
    argv = [sys.executable, os.path.join(HERE, "scenario_case.py"), case.scenario, ctx.workdir, out]
    start = time.monotonic()
    code = run_process(argv, ctx.log, timeout_s, ctx.env)
    seconds = time.monotonic() - start
    done = _scenario_output(out)  # what its finished runs emitted, even when a later one was killed
    kept = {"results": done.get("results", []), "rows": done.get("rows", [])}
    if code is None:
        return Outcome("timeout", seconds, f"killed at its {timeout_s:.0f} s timeout", **kept)
    if code != 0 or not done.get("finished"):
        return Outcome("failed", seconds, f"exit {code}: the traceback is in run.log", **kept)
    return Outcome("passed", seconds, **kept)


def _scenario_output(path: str) -> Dict:
    """scenario_case.py's OUT_JSON ({} when no run finished; it is replaced whole, never half-written)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def run_case(case: Case, timeout_s: float, ctx: Context) -> Outcome:
    return (run_scenario_case if case.scenario else run_pytest_case)(case, timeout_s, ctx)


def run_cases(selected: List[Case], records: Dict[str, Dict], budget_s: float, gpus: int,
              clock: Callable[[], float], start: float, run: Callable, ctx: Context,
              saved: Callable[[], None]) -> None:
    """Run ``selected`` in order into ``records`` (by case name): a case this node cannot run, or whose
    estimate does not fit in the budget left, is recorded as not run and the next one tried; every
    case is killed at its timeout or at the budget's end, whichever comes first. ``saved`` is called
    after every change, so a run killed from outside leaves its results."""
    for case in selected:
        record, left = records[case.name], budget_s - (clock() - start)
        if case.gpus > gpus:
            record.update(status="not run", reason=needs(case.gpus, gpus))
        elif case.estimate_s > left:
            record.update(status="not run", reason=f"budget: {max(left, 0):.0f} s left, estimate {case.estimate_s} s")
        else:
            record.update(status="running", reason=f"started at {clock() - start:.0f} s")
            saved()
            _log(ctx.log, f"==== {case.name} (tier {case.tier}, estimate {case.estimate_s} s, "
                          f"timeout {min(case.timeout_s, left):.0f} s) ====")
            began = clock()
            try:
                outcome = run(case, min(case.timeout_s, left), ctx)
            except Exception as e:  # noqa: BLE001 - one case's broken plumbing must not cost the others their turn
                outcome = Outcome("failed", clock() - began, f"the runner failed: {e!r}")
            _record(record, outcome, stopped_by_budget=outcome.status == "timeout" and left < case.timeout_s)
            _log(ctx.log, f"---- {case.name}: {record['status']} in {outcome.seconds:.1f} s {record['reason']}")
        saved()


def needs(wanted: int, visible: int) -> str:
    return f"needs {wanted} GPU{'s' if wanted > 1 else ''}, {visible} visible"


def _record(record: Dict, outcome: Outcome, stopped_by_budget: bool) -> None:
    record.update(status=outcome.status, seconds=round(outcome.seconds, 1), reason=outcome.reason,
                  tests=outcome.tests, figures=outcome.figures, results=outcome.results, rows=outcome.rows,
                  this_run=True)
    record["_junit"] = outcome.junit
    if stopped_by_budget:  # no verdict, but not "not run" either: a headline case killed here must fail the run
        record.update(status="stopped", reason=f"stopped at the budget's end after {outcome.seconds:.0f} s "
                                               "(--resume runs it again)")


def _log(log, line: str) -> None:
    """Into the full log and onto stdout (the cases' own output goes to the log only)."""
    log.write((line + "\n").encode())
    log.flush()
    print(line, flush=True)
