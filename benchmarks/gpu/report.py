"""What a GPU acceptance run leaves in its --out directory, rewritten after every case:

  results.json  the environment, every case (status, seconds, estimate, reason, tests, figures,
                results) and every RESULT line: what --resume reads
  results.md    the same as tables, to paste into BENCHMARKS.md
  junit.xml     pytest's reports of this run's cases, merged, with a suite per scenario and not-run case
  run.log       every case's stdout and stderr (written by the runner as the cases run)

Four files, none in a subfolder: the node sends back at most 8.
"""
import datetime
import json
import math
import os
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional

from cases import DERIVED

FILES = ("results.json", "results.md", "junit.xml", "run.log")
PROBLEMS = ("failed", "timeout", "skipped", "interrupted", "stopped")


def met(value, target: str) -> Optional[bool]:
    """None: a figure (no target)."""
    if not target or not isinstance(value, (int, float)):
        return None
    bound = float(target[2:])
    return value <= bound if target.startswith("<=") else value >= bound


def derived(records: List[Dict]) -> List[List]:
    """DERIVED results whose two figures are both in ``records`` (from this run or a resumed one)."""
    values = {r[0]: r[1] for rec in records for r in rec.get("results", []) if isinstance(r[1], (int, float))}
    return [[name, values[a] / values[b], target] for name, a, b, target in DERIVED
            if a in values and values.get(b)]


def result_line(name: str, value, target: str) -> str:
    shown = f"{value:.4g}" if isinstance(value, (int, float)) else str(value)
    return f"RESULT {name}={shown}" + (f" target{target}" if target else "")


def problems(state: Dict) -> List[str]:
    """This run's failed cases and missed targets (cases carried from --resume are reported, not counted)."""
    mine = [r for r in state["cases"] if r.get("this_run")]
    found = [f"{r['name']}: {r['status']} {r['reason']}".strip() for r in mine if r["status"] in PROBLEMS]
    results = [res for r in mine for res in r.get("results", [])] + state.get("derived", [])
    return found + [f"{n}={v:.4g} missed target{t}" for n, v, t in results if met(v, t) is False]


def write(out: str, state: Dict) -> None:
    state["derived"] = derived(state["cases"])
    state["result_lines"] = [result_line(*r) for rec in state["cases"] for r in rec.get("results", [])]
    state["result_lines"] += [result_line(*r) for r in state["derived"]]
    state["problems"] = problems(state)
    plain = {**state, "cases": [{k: v for k, v in r.items() if not k.startswith("_")} for r in state["cases"]]}
    # strict JSON (no NaN or Infinity, which other readers refuse): a non-finite figure is written as text
    _replace(os.path.join(out, "results.json"), json.dumps(finite(plain), indent=1, default=str, allow_nan=False))
    _replace(os.path.join(out, "results.md"), markdown(state))
    _replace(os.path.join(out, "junit.xml"), ET.tostring(junit(state["cases"]), encoding="unicode"))


def finite(value):
    """``value`` with every non-finite float as its text ("nan", "inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _replace(path: str, text: str) -> None:
    """Write whole or not at all: the run may be killed at any moment."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def table(rows: List[Dict]) -> str:
    keys = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    return "\n".join(lines + ["| " + " | ".join(str(row.get(k, "")) for k in keys) + " |" for row in rows])


def markdown(state: Dict) -> str:
    env = state["environment"]
    device = f"{env.get('gpus', 0)} x {env.get('device', 'no CUDA device')}"
    spent = f"{state['elapsed_s']:.0f} s of {state['budget_s']:.0f}"
    cases = [{"case": r["name"], "tier": r["tier"], "status": r["status"] + (" (earlier run)" if r.get("carried")
                                                                                else ""),
              "seconds": r.get("seconds", ""), "estimate": r["estimate_s"], "note": r["reason"][:200]}
             for r in state["cases"]]
    rows = [row for r in state["cases"] for row in r.get("rows", [])]
    figures = [f"- {r['name']}: {line[:200]}" for r in state["cases"] for line in r.get("figures", [])]
    parts = [f"## GPU acceptance ({device})", "",
             f"    {state['command']}    # {state['started'][:10]}, tier {state['tier']}, {spent}", "",
             table([{"device": device, "memory GiB": env.get("memory_gib", ""), "driver": env.get("driver", ""),
                     "torch": env.get("torch", ""), "CUDA": env.get("cuda", ""), "Python": env.get("python", ""),
                     "commit": env.get("commit", "")}]), "", table(cases), ""]
    if rows:
        parts += ["Scenarios:", "", table(rows), ""]
    if figures:
        parts += ["Figures the tests printed:", "", *figures, ""]
    parts += ["    " + "\n    ".join(state["result_lines"] or ["(no results)"]), "",
              "Failures and missed targets: " + ("; ".join(state["problems"]) or "none"),
              "" if state.get("finished") else "\n(the run had not finished when this was written)"]
    return "\n".join(parts) + "\n"


def junit(records: List[Dict]) -> ET.Element:
    """One <testsuites>: pytest's suite for each pytest case of this run, a suite of one testcase for
    each scenario and for each case of this run's selection that did not run (skipped, with the reason)."""
    root = ET.Element("testsuites", name="shardtrain GPU acceptance")
    for r in (r for r in records if r.get("this_run")):
        suite = r.get("_junit")
        if suite is None:
            suite = ET.Element("testsuite", name=r["name"], tests="1", time=str(r.get("seconds", 0)))
            case = ET.SubElement(suite, "testcase", classname="gpu_acceptance", name=r["name"],
                                 time=str(r.get("seconds", 0)))
            if r["status"] != "passed":
                kind = "skipped" if r["status"] == "not run" else "failure"
                ET.SubElement(case, kind, message=f"{r['status']}: {r['reason']}")
        suite.set("name", r["name"])
        root.append(suite)
    return root


def now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")
