"""A GPU scenario killed at its timeout, or failing in its second run, keeps what its finished runs measured
(issue 45, 2.5): the scenario emits each run's rows and RESULT lines as the run finishes, scenario_case.py
prints them and rewrites its JSON at once, the runner reads them back whatever the exit, and shard-train's
output reaches run.log as it is written, not when the run ends."""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gpu"))
import runner  # noqa: E402
import runs  # noqa: E402
import scenario_case  # noqa: E402
import scenarios  # noqa: E402
from cases import Case  # noqa: E402

RECORD = {"loss": 9.0, "wps": 1000.0, "mfu": 31.0, "train_wall": 8.0, "gb_peak_alloc": 10.0, "gb_rss": 5.0,
          "offload_fwd_bwd": 6.0, "offload_upload": 0.5, "offload_grad_wait": 0.25, "offload_cpu_step": 5.0,
          "offload_step_exposed": 2.0, "offload_hidden": 60.0}


def first_run_then_timeout(data_bin, workdir, name, flags, timeout=900):
    if name == "offload-after-backward":
        raise subprocess.TimeoutExpired("shard-train", timeout)
    return {"records": {"train_inner": [dict(RECORD)] * 6}, "params": 6_657_048_576, "skipped": 0}


def test_the_offload_scenario_emits_the_first_runs_figures_before_the_second_runs(monkeypatch):
    monkeypatch.setattr(scenarios, "train", first_run_then_timeout)
    monkeypatch.setattr(scenarios, "host_available_bytes", lambda: 128 * 2 ** 30)
    emitted = []
    with pytest.raises(subprocess.TimeoutExpired):
        scenarios.offload_largest("data-bin", "work", lambda rows, results: emitted.append((rows, results)))
    [(rows, results)] = emitted
    assert rows[0]["scenario"] == "offload transformer_lm_gpt3_6_7 bf16 16x2048 --cpu-step during-backward"
    assert results == [("offload_largest_params_billion", 6.657048576, ">=6.0"),
                       ("offload_largest_mfu", 0.31, ">=0.30"), ("offload_largest_words_per_s", 1000.0, ""),
                       ("offload_largest_hidden_percent", 60.0, "")]


def test_scenario_case_writes_and_prints_each_finished_run_at_once(tmp_path, monkeypatch, capsys):
    def scenario(data_bin, workdir, emit):
        emit([{"scenario": "first", "words/s": 7}], [("first_words_per_s", 7.0, "")])
        raise RuntimeError("the second run failed")

    monkeypatch.setitem(scenario_case.SCENARIOS, "two-runs", scenario)
    monkeypatch.setattr(scenario_case, "learnable_data_bin", lambda path: path)
    out = tmp_path / "out.json"
    assert scenario_case.main(["two-runs", str(tmp_path), str(out)]) == 1
    assert json.loads(out.read_text()) == {"rows": [{"scenario": "first", "words/s": 7}],
                                           "results": [["first_words_per_s", 7.0, ""]], "finished": False}
    printed = capsys.readouterr()
    assert printed.out == "scenario: first | words/s: 7\nRESULT first_words_per_s=7\n"
    assert "RuntimeError: the second run failed" in printed.err


@pytest.mark.parametrize("code, status", [(None, "timeout"), (1, "failed"), (0, "failed")])
def test_the_runner_keeps_a_killed_or_failed_scenarios_figures(tmp_path, monkeypatch, code, status):
    """Exit 0 without "finished" (a scenario that returned early) is no pass either."""
    def scenario_process(argv, log, timeout_s, env=None):
        with open(argv[-1], "w") as f:
            json.dump({"rows": [{"scenario": "first"}], "results": [["first_words_per_s", 7.0, ""]],
                       "finished": False}, f)
        return code

    monkeypatch.setattr(runner, "run_process", scenario_process)
    with open(tmp_path / "run.log", "ab") as log:
        ctx = runner.Context(str(tmp_path), log, {})
        outcome = runner.run_scenario_case(Case("s", 1, 1, "", scenario="s"), 60, ctx)
    assert (outcome.status, outcome.results, outcome.rows) == (status, [["first_words_per_s", 7.0, ""]],
                                                               [{"scenario": "first"}])


@pytest.mark.slow
def test_a_run_killed_at_its_timeout_has_its_output_in_the_log_already(tmp_path, monkeypatch, capfd):
    """shard-train stood in for by a script that logs a line and hangs: held in memory, the line was lost."""
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho 'a record written before the kill'\nsleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setattr(runs.sys, "executable", str(fake))
    with pytest.raises(subprocess.TimeoutExpired):
        runs.train("data-bin", str(tmp_path), "hangs", [], timeout=3)
    assert "a record written before the kill" in capfd.readouterr().out
