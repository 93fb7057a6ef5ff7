"""benchmarks/gpu/run_all.py without a GPU: the catalogue covers tests/gpu and each tier fits the budget;
with a stand-in case runner on a fake clock the budget is respected, results are written after every
case into at most 8 files, a tier resumes where the last stopped, and 2-GPU cases are listed as not
run on one GPU; the real runner kills a hanging case (and its children) at its timeout. Its faults
(user mistakes, a hung probe, signals, the commit stamp): test_gpu_runner_faults.py."""
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gpu"))
import cases  # noqa: E402
import run_all  # noqa: E402
import runner  # noqa: E402
from cases import Case  # noqa: E402
from gpu_runner_fakes import FAKE, ONE_GPU, REPO, Clock, main, stand_in, statuses  # noqa: E402



@pytest.mark.slow
def test_the_catalogue_runs_every_gpu_test_exactly_once_and_every_scenario():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "tests/gpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    collected = [line for line in done.stdout.splitlines() if line.startswith("tests/gpu/") and "::" in line]
    assert len(collected) >= 47, done.stdout[-2000:]
    assert cases.coverage(collected, cases.CASES) == {"uncovered": [], "twice": [], "stale": []}
    missing = [Case("x", 1, 1, "", ("tests/gpu/test_memory_metrics.py",))]  # the check can fail
    assert len(cases.coverage(collected, missing)["uncovered"]) == len(collected) - 2
    import scenarios
    assert sorted(c.scenario for c in cases.CASES if c.scenario) == sorted(scenarios.SCENARIOS)


def test_each_tier_fits_the_budget_and_tier_1_is_in_the_issues_order():
    one, two = cases.tier_seconds(cases.CASES, gpus=1), cases.tier_seconds(cases.CASES, gpus=2)
    assert sorted(one) == [1, 2, 3, 4, 5] and sorted(two) == [1, 2, 3, 4, 5, 6, 7]
    assert all(seconds <= 480 for seconds in two.values()), two
    # issue 39: the adafactor-under-offload fix re-checked first, then the step during backward, then the largest
    # offload model; what was tier 1 (run twice on an H100) follows as tier 2
    assert [c.name for c in cases.CASES if c.tier == 1] == [
        "offload-recipe-one-gpu", "step-in-backward-gpu", "scenario-offload-largest"]
    assert [c.name for c in cases.CASES if c.tier == 2] == [
        "offload-placement", "async-save-exact-resume", "rng-per-rank-one-gpu",
        "cpu-adam-master-copy", "gpu-init-bitwise-cpu-init", "fsdp-accumulation-one-gpu",
        "cpu-flag-no-cuda-context", "consolidate-without-gpus", "memory-metrics", "fp16-logit-gradient-range",
        "compile-bf16", "mfu-data-sheet", "precision-matrix-one-gpu", "scenario-mfu",
        "scenario-llama-1b", "scenario-llama-doc-mask-8k"]  # issue 46, item 8: the llama cases, after tier 2's own
    assert all(c.timeout_s > c.estimate_s and c.basis for c in cases.CASES)


def test_a_case_that_does_not_fit_in_the_budget_left_is_not_started(tmp_path):
    clock, seen = Clock(), []
    # a: 40 s (60 left), b: 50 s (10 left), c (estimate 20) does not fit, d (5) does
    assert main(["--budget", "100", "--out", str(tmp_path)], clock, seen) == 0
    assert seen == ["a", "b", "d"]
    found = statuses(tmp_path)
    assert found["c"] == ("not run", "budget: 10 s left, estimate 20 s")
    assert found["e"] == ("not run", "tier 2") and found["two"] == ("not run", "needs 2 GPUs, 1 visible")


def test_two_gpu_cases_are_listed_as_not_run_on_one_gpu(tmp_path):
    clock, seen = Clock(), []
    assert main(["--tier", "2", "--out", str(tmp_path)], clock, seen) == 0
    assert seen == ["e"]
    assert statuses(tmp_path)["two"] == ("not run", "needs 2 GPUs, 1 visible")
    suites = {s.get("name"): s for s in ET.parse(tmp_path / "junit.xml").getroot()}
    assert suites["two"].find("testcase/skipped").get("message") == "not run: needs 2 GPUs, 1 visible"
    assert "| two | 2 | not run |" in (tmp_path / "results.md").read_text()
    seen.clear()
    assert main(["--tier", "2", "--out", str(tmp_path / "two-gpus")], clock, seen, env={**ONE_GPU, "gpus": 2}) == 0
    assert seen == ["two", "e"]


def test_the_files_their_count_and_fields(tmp_path):
    clock, seen = Clock(), []
    out = tmp_path / "out"
    assert main(["--budget", "480", "--out", str(out)], clock, seen) == 0
    assert sorted(os.listdir(out)) == ["junit.xml", "results.json", "results.md", "run.log"]  # <= 8, no folders
    state = json.loads((out / "results.json").read_text())
    assert {k: state["environment"][k] for k in ("device", "driver", "torch", "python")} == {
        "device": "NVIDIA H100 80GB HBM3", "driver": "570.86.15", "torch": "2.11.0+cu130", "python": "3.12.3"}
    a = next(r for r in state["cases"] if r["name"] == "a")
    assert (a["status"], a["seconds"], a["estimate_s"], a["timeout_s"]) == ("passed", 40, 30, 120)
    assert state["result_lines"].count("RESULT speed=2.5 target>=1") == 4 and state["finished"]
    md = (out / "results.md").read_text()
    assert "1 x NVIDIA H100 80GB HBM3" in md and "RESULT speed=2.5 target>=1" in md and "570.86.15" in md
    assert "==== a (tier 1, estimate 30 s, timeout 120 s) ====" in (out / "run.log").read_text()
    suites = ET.parse(out / "junit.xml").getroot()
    assert [s.get("name") for s in suites] == ["a", "b", "c", "d"]  # this run's cases


def test_results_are_on_disk_after_every_case(tmp_path):
    clock, seen, snapshots = Clock(), [], []
    run = stand_in(clock, seen)

    def looking(case, timeout_s, ctx):
        snapshots.append(statuses(tmp_path))  # what a run killed now would leave
        return run(case, timeout_s, ctx)

    run_all.main(["--out", str(tmp_path)], catalogue=FAKE, run_case=looking, probe=lambda: dict(ONE_GPU), clock=clock,
                 start=clock.now)
    assert snapshots[1]["a"][0] == "passed" and snapshots[1]["b"][0] == "running"


def test_a_tier_resumes_where_the_last_stopped(tmp_path):
    clock, seen = Clock(), []
    first, second, third = tmp_path / "1", tmp_path / "2", tmp_path / "3"
    assert main(["--budget", "100", "--out", str(first)], clock, seen, fail=("a",)) == 1  # c did not fit
    seen.clear()
    assert main(["--tier", "2", "--resume", str(first / "results.json"), "--out", str(second)], clock, seen) == 0
    assert seen == ["c", "e"]  # tier 1's leftover first; a (failed) and b, d (passed) are not run again
    found = statuses(second)
    assert found["a"][0] == "failed" and found["c"][0] == found["e"][0] == "passed"
    assert "| a | 1 | failed (earlier run) |" in (second / "results.md").read_text()
    seen.clear()
    assert main(["--resume", str(second / "results.json"), "--out", str(third)], clock, seen) == 0
    assert seen == ["f"]  # without --tier: the first tier with cases not run


def test_a_case_running_or_interrupted_when_the_run_was_killed_is_run_again(tmp_path):
    clock, seen = Clock(), []
    main(["--out", str(tmp_path)], clock, seen)
    state = json.loads((tmp_path / "results.json").read_text())
    state["cases"][0]["status"] = "running"  # as a run killed (SIGKILL) during case a leaves it
    state["cases"][5]["status"] = "running"  # e, of tier 2: not this tier, carried
    state["cases"][2]["status"] = "interrupted"  # as a run stopped by SIGTERM during case c leaves it
    (tmp_path / "killed.json").write_text(json.dumps(state))
    seen.clear()
    main(["--tier", "1", "--resume", str(tmp_path / "killed.json"), "--out", str(tmp_path / "next")], clock, seen)
    found = statuses(tmp_path / "next")
    assert seen == ["a", "c"] and found["a"][0] == found["c"][0] == "passed"
    assert found["e"][0] == "interrupted" and "killed from outside" in found["e"][1]


def test_a_case_whose_runner_raises_fails_and_the_next_one_runs(tmp_path):
    clock, seen = Clock(), []
    run = stand_in(clock, seen)

    def broken(case, timeout_s, ctx):
        if case.name == "a":
            raise OSError("No space left on device")
        return run(case, timeout_s, ctx)

    assert run_all.main(["--out", str(tmp_path)], catalogue=FAKE, run_case=broken, probe=lambda: dict(ONE_GPU),
                        clock=clock, start=clock.now) == 1
    assert statuses(tmp_path)["a"] == ("failed", "the runner failed: OSError('No space left on device')")
    assert seen == ["b", "c", "d"]


def test_the_budgets_end_stops_a_case_which_then_has_no_verdict(tmp_path):
    """Issue 45, 2.4: a started case killed when the budget ran out (the headline, say) fails the run: recorded
    "not run", it let run_all.py exit 0 without it."""
    clock, seen = Clock(), []
    slow = [Case("a", 1, 30, "fake", ("tests/gpu/test_a.py",), timeout=200)]  # takes 40, 35 s left
    assert main(["--budget", "35", "--out", str(tmp_path)], clock, seen, catalogue=slow) == 1
    reason = "stopped at the budget's end after 35 s (--resume runs it again)"
    assert statuses(tmp_path)["a"] == ("stopped", reason)
    state = json.loads((tmp_path / "results.json").read_text())
    assert state["problems"] == ["a: stopped " + reason]
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.find("testcase/failure").get("message") == "stopped: " + reason
    seen.clear()
    assert main(["--resume", str(tmp_path / "results.json"), "--out", str(tmp_path / "again")], clock, seen,
                catalogue=slow) == 0  # the default budget: it runs whole and passes
    assert seen == ["a"] and statuses(tmp_path / "again")["a"][0] == "passed"


def test_exit_status(tmp_path, capsys):
    clock, seen = Clock(), []
    assert main(["--out", str(tmp_path / "ok")], clock, seen) == 0
    assert main(["--out", str(tmp_path / "missed")], clock, seen, results={"d": [["speed", 0.5, ">=1"]]}) == 1
    assert json.loads((tmp_path / "missed" / "results.json").read_text())["problems"] == [
        "speed=0.5 missed target>=1"]
    assert main(["--out", str(tmp_path / "no-cuda")], clock, seen, env={"gpus": 0}) == 0  # a stand-in: runs
    assert run_all.main(["--out", str(tmp_path / "real")], catalogue=FAKE, probe=lambda: {"gpus": 0}) == 2
    assert set(statuses(tmp_path / "real")["a"]) == {"not run", "no CUDA device is visible"}
    assert run_all.main(["--out", str(tmp_path), "--resume", str(tmp_path / "nothing.json")]) == 2
    assert "cannot be read as a run_all.py results.json" in capsys.readouterr().err
    assert run_all.main(["--out", str(tmp_path), "--tier", "9"], catalogue=FAKE) == 2
    assert "the catalogue has tiers 1 to 3" in capsys.readouterr().err


def test_write_benchmarks_replaces_the_section(tmp_path, monkeypatch):
    (tmp_path / "BENCHMARKS.md").write_text("# Benchmarks\n\nother figures\n")
    monkeypatch.setattr(run_all, "ROOT", str(tmp_path))
    clock, seen = Clock(), []
    main(["--out", str(tmp_path / "o1")], clock, seen)
    assert run_all.BEGIN not in (tmp_path / "BENCHMARKS.md").read_text()  # only with the flag
    main(["--out", str(tmp_path / "o2"), "--write-benchmarks"], clock, seen)
    main(["--out", str(tmp_path / "o3"), "--write-benchmarks", "--tier", "2"], clock, seen)
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "other figures" in text and text.count(run_all.BEGIN) == 1 and "--tier 2" in text


@pytest.mark.slow
def test_the_real_runner_reads_pytest_and_kills_a_hanging_case_with_its_children(tmp_path):
    (tmp_path / "test_fake.py").write_text(
        "import subprocess, sys, time\n"
        "def test_prints(tmp_path):\n"  # tmp_path: the first GPU run failed every test taking one
        "    (tmp_path / 'x').write_text('x')\n"
        "    print('2026-11-26 07:42:19 | INFO | shardtrain.trainer.loop | a log record, not a figure')\n"
        "    print('figure: 42 GB/s')\n"
        "    print('RESULT fake_speed=3.5 target>=2')\n"
        "def test_hangs():\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"    open({str(tmp_path / 'child.pid')!r}, 'w').write(str(child.pid))\n"
        "    time.sleep(120)\n")
    with open(tmp_path / "run.log", "ab") as log:
        ctx = runner.Context(str(tmp_path / "work"), log, run_all.child_env())
        fine = runner.run_case(Case("fine", 1, 1, "", (str(tmp_path / "test_fake.py::test_prints"),)), 120, ctx)
        began = time.monotonic()
        hung = runner.run_case(Case("hung", 1, 1, "", (str(tmp_path / "test_fake.py::test_hangs"),)), 8, ctx)
    assert (fine.status, fine.figures, fine.results) == ("passed", ["figure: 42 GB/s"], [["fake_speed", 3.5, ">=2"]])
    assert fine.tests[0]["outcome"] == "passed" and fine.tests[0]["id"].endswith("test_fake.py::test_prints")
    assert hung.status == "timeout" and time.monotonic() - began < 60, hung
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10  # the kill is asynchronous
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child), "the hanging test's own child outlived the case"


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_skipped_or_failed_test_makes_its_case_fail(tmp_path):
    """A 1-GPU case whose test skips itself on a GPU node: the node is not what the case expects."""
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite name="x"><testcase classname="tests.gpu.test_x" name="test_ok" time="1.5"/>'
        '<testcase classname="tests.gpu.test_x" name="test_skip" time="0"><skipped message="needs CUDA"/></testcase>'
        '</testsuite></testsuites>')
    skipped = runner._read_junit(str(junit))
    assert skipped.status == "skipped" and "tests/gpu/test_x.py::test_skip: skipped needs CUDA" in skipped.reason
    junit.write_text(junit.read_text().replace('<skipped message="needs CUDA"/>', '<failure message="boom"/>'))
    assert runner._read_junit(str(junit)).status == "failed"


def test_the_readmes_commands_are_ones_run_all_accepts():
    with open(os.path.join(REPO, "docs", "gpu_acceptance.md")) as f:
        commands = [line.split("#")[0].split() for line in f
                    if line.strip().startswith("python benchmarks/gpu/run_all.py")]
    assert len(commands) >= 2
    for argv in commands:
        args = run_all.parse_args(argv[2:], [1, 2, 3, 4, 5, 6, 7])
        assert args.budget == 480 and args.out
    assert any(run_all.parse_args(argv[2:], [1, 2]).resume == "DIR/results.json" for argv in commands)


@pytest.mark.slow
def test_a_catalogue_case_through_the_real_runner(tmp_path):
    """The pytest command a GPU node runs, here without CUDA: tests/gpu's tests are collected by the
    catalogue's node ids and skip themselves, which on a node said to have a GPU fails the case."""
    case = cases.by_name(cases.CASES)["memory-metrics"]
    assert run_all.main(["--out", str(tmp_path), "--tier", str(case.tier)], catalogue=[case], run_case=runner.run_case,
                        probe=lambda: dict(ONE_GPU)) == 1
    record = json.loads((tmp_path / "results.json").read_text())["cases"][0]
    assert record["status"] == "skipped" and "needs CUDA" in record["reason"]
    assert [t["id"] for t in record["tests"]] == [
        "tests/gpu/test_memory_metrics.py::test_a_short_run_logs_device_and_host_memory",
        "tests/gpu/test_memory_metrics.py::test_a_large_allocation_lowers_gb_free_in_the_next_record_only"]
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite.get("name") == "memory-metrics" and suite.get("skipped") == "2"
