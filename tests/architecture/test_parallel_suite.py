"""README's test command runs the suite with pytest-xdist's ``-n auto``: tests/conftest.py decides how many workers
(a core each, at most 4) and that each test file goes to one worker (its module fixtures made once)."""
import importlib.util
import pathlib
import types

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
# by its path, as test_test_hygiene.py does: ``import conftest`` may get tests/data's
_spec = importlib.util.spec_from_file_location("suite_conftest_xdist", TESTS / "conftest.py")
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)


@pytest.mark.parametrize("cores, workers", [(1, 1), (2, 2), (3, 3), (4, 4), (16, 4)])
def test_auto_gives_a_worker_a_core_up_to_four(monkeypatch, cores, workers):
    monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert conftest.pytest_xdist_auto_num_workers(None) == workers


def _config(numprocesses, dist):
    return types.SimpleNamespace(option=types.SimpleNamespace(numprocesses=numprocesses, dist=dist))


@pytest.mark.parametrize("numprocesses, given, used", [
    (2, "no", "loadfile"),  # -n without --dist: a file a worker
    (2, "load", "load"), (2, "worksteal", "worksteal"),  # a --dist the user gave is kept
    (None, "no", "no"), (0, "no", "no"),  # no workers: xdist stays out of the way
])
def test_dash_n_without_dist_sends_each_file_to_one_worker(numprocesses, given, used):
    config = _config(numprocesses, given)
    conftest.pytest_cmdline_main(config)
    assert config.option.dist == used


def test_the_readme_command_is_the_one_that_spreads_the_suite_and_ci_runs_it():
    readme = (TESTS.parent / "README.md").read_text()
    assert 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q -n auto tests' in readme
    ci = (TESTS.parent / ".ci" / "run").read_text()
    first_run = ci.split("# Second run", 1)[0]  # .ci/run's first run is README's command in a new venv
    assert "pip install torch==2.13.0 && pip install -e \".[test]\" &&" in first_run
    assert "python -m pytest -q -n auto tests'" in first_run
    pyproject = (TESTS.parent / "pyproject.toml").read_text()
    assert '"pytest-xdist>=3.5"' in pyproject.split("test = [", 1)[1].split("]", 1)[0]
