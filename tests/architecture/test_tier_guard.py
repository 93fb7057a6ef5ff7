"""The fast tier's guard (tests/tier_guard.py): a test not marked slow that starts a process, a process group of
more than one rank or a training run fails, naming what it started; a slow one may. Each check below runs in
this unmarked test, so the guard is live: it raises before anything is started, and the record it keeps is
cleared before the test's call ends (taken()) so that this test itself passes."""
import multiprocessing
import os
import subprocess
import sys

import pytest
import torch.distributed

import tier_guard
from shardtrain.trainer import loop

GUARD = pytest.fail.Exception  # a BaseException: `except Exception` in the code under test cannot swallow it


def taken() -> list:
    """The guard's record of this test so far, cleared (conftest fails a call that ends with one)."""
    record = tier_guard.swallowed()
    tier_guard._State.violations.clear()
    return record


def test_an_unmarked_test_cannot_start_a_process(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(GUARD, match=r"^the test starts a process \(touch "):
        subprocess.run(["touch", str(marker)])
    with pytest.raises(GUARD, match=r"^the test starts a process \(.*python"):
        subprocess.check_output([sys.executable, "-c", "pass"])
    with pytest.raises(GUARD, match=r"^the test starts a process \(multiprocessing\)"):
        multiprocessing.get_context("spawn").Process(target=print).start()
    with pytest.raises(GUARD, match=r"^the test starts a process \(os.fork\)"):
        os.fork()
    assert not marker.exists()  # refused before it started
    record = taken()
    assert len(record) == 4 and all(m.endswith("(the fast tier, -m 'not slow', starts no process, no process group "
                                               "of more than one rank and no training run)") for m in record)


def test_an_unmarked_test_cannot_start_a_group_of_several_ranks_or_a_training_run(monkeypatch):
    with pytest.raises(GUARD, match="^the test starts a process group of 2 ranks"):
        torch.distributed.init_process_group("gloo", init_method="file:///nonexistent", rank=0, world_size=2)
    monkeypatch.setenv("WORLD_SIZE", "3")  # as torchrun sets it, with no world_size argument
    with pytest.raises(GUARD, match="^the test starts a process group of 3 ranks"):
        torch.distributed.init_process_group("gloo")
    with pytest.raises(GUARD, match=r"^the test starts a training run \(shardtrain.trainer.loop.train\)"):
        loop.train(None)
    assert len(taken()) == 3
    assert not torch.distributed.is_initialized()


@pytest.mark.slow
def test_a_slow_test_may(tmp_path):
    subprocess.run(["touch", str(tmp_path / "ran")], check=True)
    assert (tmp_path / "ran").exists()
    assert tier_guard._State.violations == []


def test_a_swallowed_refusal_is_still_recorded():
    try:
        subprocess.run(["true"])
    except BaseException:  # noqa: B036 - what a careless thread or cleanup might do
        pass
    assert taken() == [f"the test starts a process (true): {tier_guard.ADVICE}"]


def test_conftest_fails_what_the_guard_refused_even_when_it_was_swallowed(pytester, monkeypatch):
    """The hooks themselves, in a pytest session run in this process with this suite's conftest.py (and no
    installed plugins: one, pytest-benchmark, asks git at the session's start)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "conftest.py")).read())
    pytester.makepyfile(test_inner="""
        import subprocess
        import pytest

        def test_starts_one():
            subprocess.run(["true"])

        def test_swallows_it():
            try:
                subprocess.run(["true"])
            except BaseException:
                pass

        @pytest.mark.slow
        def test_marked():
            subprocess.run(["true"], check=True)

        def test_light():
            assert 1 + 1 == 2
        """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=2)
    assert "FAILED test_inner.py::test_swallows_it" in result.stdout.str()
    assert pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-m", "not slow").parseoutcomes()["deselected"] == 1
