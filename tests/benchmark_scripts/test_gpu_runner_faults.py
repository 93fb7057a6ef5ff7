"""benchmarks/gpu/run_all.py's faults without a GPU: user mistakes (--resume, --out, --budget) are one
paragraph and exit 2; a hung probe, a NaN figure and a signal from outside (the running case's process group
killed, an interrupted case run again by --resume) still leave valid results; the commit is stamped for a
node without .git."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gpu"))
import run_all  # noqa: E402
from gpu_runner_fakes import FAKE, ONE_GPU, REPO, Clock, main, stand_in  # noqa: E402


def refusal(capsys) -> str:
    """The one paragraph run_all.py prints for a user mistake (no traceback)."""
    err = capsys.readouterr().err
    assert err.startswith("run_all.py: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("text", ['{"cases": [{"status": "passed"}]}', '{"cases": "abc"}', '{"cases": [1]}',
                                  'not JSON at all', '[]', '{"cases": [{"name": "a", "status": 3}]}'])
def test_a_resume_file_that_is_not_a_results_json_is_refused_in_one_paragraph(tmp_path, capsys, text):
    (tmp_path / "bad.json").write_text(text)
    clock, seen = Clock(), []
    assert main(["--resume", str(tmp_path / "bad.json"), "--out", str(tmp_path / "o")], clock, seen) == 2
    assert "cannot be read as a run_all.py results.json" in refusal(capsys) and seen == []


def test_an_out_directory_that_cannot_be_written_is_refused_before_the_probe(tmp_path, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)  # stops a user; root (as in CI containers) is stopped by the stand-ins below

    def guarded(real):
        def call(path, *args, **kwargs):
            if str(path).startswith(str(locked)):
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, *args, **kwargs)
        return call

    monkeypatch.setattr("builtins.open", guarded(open))
    monkeypatch.setattr(os, "makedirs", guarded(os.makedirs))
    for out in (locked, locked / "new"):  # an existing read-only folder, and a folder to create in one
        assert run_all.main(["--out", str(out)], catalogue=FAKE, run_case=stand_in(Clock(), []),
                            probe=lambda: pytest.fail("probed before --out was checked")) == 2
        err = refusal(capsys)
        assert f"--out '{out}' cannot be written (Permission denied)" in err


@pytest.mark.slow
def test_a_probe_that_hangs_is_recorded_and_the_results_are_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_all, "PROBE", "import time; time.sleep(60)")
    monkeypatch.setattr(run_all, "PROBE_TIMEOUT_S", 1)
    assert run_all.main(["--out", str(tmp_path)], catalogue=FAKE) == 2
    state = json.loads((tmp_path / "results.json").read_text())
    said = "the device probe (a Python that imports torch and counts the GPUs) timed out after 1 s"
    assert said in state["environment"]["error"] and state["environment"]["gpus"] == 0
    assert {r["name"]: r["status"] for r in state["cases"] if said in r["reason"]} == {
        "a": "not run", "b": "not run", "c": "not run", "d": "not run"}
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("budget", ["nan", "inf", "-inf", "0", "-5"])
def test_a_budget_that_is_not_a_finite_positive_number_is_refused(tmp_path, capsys, budget):
    assert main([f"--budget={budget}", "--out", str(tmp_path)], Clock(), []) == 2
    assert "the run's wall seconds must be a finite number > 0" in refusal(capsys)
    assert not (tmp_path / "results.json").exists()


def test_results_json_is_strict_json_when_a_figure_is_not_finite(tmp_path):
    clock, seen = Clock(), []
    results = {"a": [["speed", float("nan"), ">=1"]], "d": [["ratio", float("inf"), ""]]}
    assert main(["--out", str(tmp_path)], clock, seen, results=results) == 1  # nan misses its target

    def refuse(constant):
        raise AssertionError(f"{constant} in results.json")

    state = json.loads((tmp_path / "results.json").read_text(), parse_constant=refuse)
    assert [r["results"] for r in state["cases"] if r["name"] in ("a", "d")] == [
        [["speed", "nan", ">=1"]], [["ratio", "inf", ""]]]
    assert state["problems"] == ["speed=nan missed target>=1"]


def test_the_budget_counts_from_main_not_from_the_import(tmp_path):
    """pytest imports run_all at collection: an hour of other tests later the budget is still whole."""
    clock, seen = Clock(), []
    clock.now = time.monotonic() + 3600
    assert run_all.main(["--budget", "100", "--out", str(tmp_path)], catalogue=FAKE, run_case=stand_in(clock, seen),
                        probe=lambda: dict(ONE_GPU), clock=clock) == 0
    assert seen == ["a", "b", "d"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_a_signal_during_a_case_records_it_as_interrupted_and_writes_the_results(tmp_path, signum, capsys):
    clock, seen = Clock(), []
    run = stand_in(clock, seen)
    before = {s: signal.getsignal(s) for s in run_all.SIGNALS}

    def killed_in_b(case, timeout_s, ctx):
        if case.name == "b":
            os.kill(os.getpid(), signum)  # the handler raises in this thread, as it would inside proc.wait
        return run(case, timeout_s, ctx)

    assert run_all.main(["--out", str(tmp_path)], catalogue=FAKE, run_case=killed_in_b, probe=lambda: dict(ONE_GPU),
                        clock=clock, start=clock.now) == 128 + signum
    state = json.loads((tmp_path / "results.json").read_text())
    found = {r["name"]: (r["status"], r["reason"]) for r in state["cases"]}
    name = signal.Signals(signum).name
    assert found["a"][0] == "passed" and found["c"] == ("not run", "queued")
    assert found["b"] == ("interrupted", f"run_all.py got {name} while this case ran; its process group was "
                                         "killed (--resume runs it again)")
    assert state["interrupted"] == name and not state["finished"]
    assert f"stopped by {name}" in capsys.readouterr().err
    assert {s: signal.getsignal(s) for s in run_all.SIGNALS} == before  # pytest's own handlers are back


DRIVER = """import os, sys
sys.path.insert(0, {bench!r})
import run_all, runner
from cases import Case
CHILD = ("import os, subprocess, sys, time\\n"
         "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\\n"
         "open(sys.argv[1] + '.tmp', 'w').write(f'{{os.getpid()}} {{g.pid}}')\\n"
         "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\\n"
         "time.sleep(300)\\n")

def sleeper(case, timeout_s, ctx):
    runner.run_process([sys.executable, "-c", CHILD, {pids!r}], ctx.log, timeout_s, ctx.env)
    return runner.Outcome("passed", 0.0)

catalogue = [Case("sleeper", 1, 30, "fake", ("tests/gpu/test_s.py",), timeout=400),
             Case("after", 1, 5, "fake", ("tests/gpu/test_t.py",))]
sys.exit(run_all.main(["--out", {out!r}], catalogue=catalogue, run_case=sleeper, probe=lambda: {{"gpus": 1}}))
"""


def group_members(pgid: int) -> list:
    """The live (not zombie) processes of process group ``pgid``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(pid))
    return found


@pytest.mark.slow
def test_sigterm_kills_the_running_cases_process_group_and_writes_the_results(tmp_path):
    pids, out = tmp_path / "pids", tmp_path / "out"
    (tmp_path / "driver.py").write_text(DRIVER.format(bench=os.path.join(REPO, "benchmarks", "gpu"),
                                                      pids=str(pids), out=str(out)))
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    pgid = None
    try:
        deadline = time.monotonic() + 120
        while not pids.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert pids.exists(), proc.stderr.read().decode()[-2000:]
        pgid, grandchild = map(int, pids.read_text().split())  # the case leads its own group (setsid)
        assert set(group_members(pgid)) == {pgid, grandchild}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM, proc.stderr.read().decode()[-2000:]
        deadline = time.monotonic() + 10  # the kill is asynchronous
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert group_members(pgid) == [], "the interrupted case still holds its processes (and its GPU)"
        state = json.loads((out / "results.json").read_text())
        assert [(r["name"], r["status"]) for r in state["cases"]] == [("sleeper", "interrupted"),
                                                                      ("after", "not run")]
        assert state["interrupted"] == "SIGTERM"
    finally:
        proc.kill()
        if pgid is not None and group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)


@pytest.mark.slow
def test_the_commit_is_stamped_before_the_tree_leaves_git(tmp_path, monkeypatch):
    import stamp_commit
    repo, copy = tmp_path / "repo", tmp_path / "copy"
    (repo / "benchmarks" / "gpu").mkdir(parents=True)
    (repo / "a.txt").write_text("a")
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    for argv in (["init", "-q"], ["add", "a.txt"], ["commit", "-q", "-m", "one"]):
        subprocess.run(git + argv, cwd=repo, check=True, capture_output=True, timeout=60)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                          timeout=60).stdout.strip()
    assert len(head) >= 7 and stamp_commit.commit(str(repo)) == head
    (repo / "a.txt").write_text("changed")
    assert stamp_commit.main(str(repo)) == 0
    assert (repo / "benchmarks" / "gpu" / "COMMIT").read_text() == head + "+dirty\n"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))  # what reaches the node
    monkeypatch.setattr(run_all, "ROOT", str(copy))
    monkeypatch.setattr(run_all, "PROBE", "print('{\"gpus\": 0}')")
    assert run_all.probe_environment()["commit"] == head + "+dirty (stamped)"
    (copy / "benchmarks" / "gpu" / "COMMIT").unlink()
    assert run_all.probe_environment()["commit"] == "unknown"
    assert stamp_commit.main(str(copy)) == 2  # no git there: said, nothing written
    assert not (copy / "benchmarks" / "gpu" / "COMMIT").exists()
