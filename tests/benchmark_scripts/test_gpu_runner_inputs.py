"""benchmarks/gpu/run_all.py's inputs at their edges, in process (no GPU): a junit XML that holds no test, a
timeout exactly as long as the budget left, pytest exiting non-zero beside a passing junit, --tier 0. The
mutation run found each tested only in its normal form (issue 45)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gpu"))
import run_all  # noqa: E402
import runner  # noqa: E402
from cases import Case  # noqa: E402
from gpu_runner_fakes import Clock, main, statuses  # noqa: E402

PASSING = ('<testsuites><testsuite name="x"><testcase classname="tests.gpu.test_x" name="test_ok" time="1.5"/>'
           '</testsuite></testsuites>')


def test_a_junit_that_holds_no_test_fails_its_case(tmp_path):
    """pytest collected nothing (a node id renamed away): the case proved nothing."""
    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite name="x" tests="0"></testsuite></testsuites>')
    empty = runner._read_junit(str(junit))
    assert (empty.status, empty.reason, empty.tests) == ("failed", "no test ran", [])


def test_a_timeout_exactly_as_long_as_the_budget_left_keeps_its_verdict(tmp_path):
    """Its own timeout killed it, not the budget: "timeout", a verdict --resume keeps."""
    clock, seen = Clock(), []
    hangs = [Case("a", 1, 30, "fake", ("tests/gpu/test_a.py",), timeout=35)]  # takes 40; 35 s left, timeout 35
    assert main(["--budget", "35", "--out", str(tmp_path)], clock, seen, catalogue=hangs) == 1
    assert statuses(tmp_path)["a"] == ("timeout", "killed")
    seen.clear()
    main(["--resume", str(tmp_path / "results.json"), "--out", str(tmp_path / "again")], clock, seen, catalogue=hangs)
    assert seen == []


def test_pytest_exiting_non_zero_beside_a_passing_junit_fails_the_case(tmp_path, monkeypatch):
    """An error at teardown or in a conftest can leave every testcase passed and pytest exiting 1."""
    def fake_pytest(argv, log, timeout_s, env=None):
        junit = argv[argv.index("--junitxml") + 1]
        os.makedirs(os.path.dirname(junit), exist_ok=True)
        with open(junit, "w") as f:
            f.write(PASSING)
        return 1

    monkeypatch.setattr(runner, "run_process", fake_pytest)
    with open(tmp_path / "run.log", "ab") as log:
        ctx = runner.Context(str(tmp_path / "work"), log, {})
        outcome = runner.run_pytest_case(Case("x", 1, 1, "", ("tests/gpu/test_x.py",)), 60, ctx)
    assert (outcome.status, outcome.reason) == ("failed", "pytest exited 1")
    assert outcome.tests[0]["outcome"] == "passed"  # the junit itself said all was well


@pytest.mark.parametrize("tier", ["0", "-1", "4"])
def test_a_tier_outside_the_catalogue_is_refused(tmp_path, capsys, tier):
    """--tier 0 ran nothing and exited 0: a run that tested nothing must not read as a pass."""
    clock, seen = Clock(), []
    assert main(["--tier", tier, "--out", str(tmp_path)], clock, seen) == 2
    err = capsys.readouterr().err
    assert err == f"run_all.py: error: --tier {tier}: the catalogue has tiers 1 to 3 (benchmarks/gpu/cases.py).\n"
    assert seen == [] and not os.path.exists(tmp_path / "results.json")
    assert run_all.parse_args(["--tier", "1", "--out", str(tmp_path)], [1, 2, 3]).tier == 1
