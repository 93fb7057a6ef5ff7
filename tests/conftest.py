"""Test hygiene, applied to every test: environment, RNG seeds, logging and
process groups are restored so no test leaks state into the next."""
import logging
import os
import random
import signal
import sys

import pytest
import torch

# tests/helpers holds the modules tests in several rooms share (the rank mains, the small trainer): importable by
# name from any test folder, and from the ranks a test spawns (spawn passes sys.path on).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers"))

import tier_guard  # noqa: E402

pytest_plugins = ["pytester"]  # tests/architecture/test_tier_guard.py runs the hooks in a session of their own


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "flag_effect(*flags): the test passes these shard-train flags a non-default value and asserts "
        "the effect; benchmarks/flag_coverage.py lists them")
    config.addinivalue_line(
        "markers", "slow: the test starts a process, a process group of more than one rank or a training run; "
        "the fast tier (-m 'not slow') leaves it out, and tier_guard.py fails an unmarked test that does")
    tier_guard.install()
    # A shell starts a background job (`.ci/run &`, nohup) with SIGINT ignored, and an ignored signal stays
    # ignored across exec: the commands the Ctrl-C tests interrupt would never see it. A handler set here is
    # reset to the default by exec, so every process the tests start takes Ctrl-C as it does from a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """With -n and no --dist, each test file goes to one worker (xdist's loadfile), not each test: a file's module
    fixtures (the side-by-side runs, the shared data-bins) are then made once, not once in each worker. Before
    xdist's own hook, which makes "no" "load"; a --dist given on the command line is kept."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", None) == "no":
        config.option.dist = "loadfile"


@pytest.hookimpl(optionalhook=True)  # a session without pytest-xdist (-p no:xdist, pytester's) has no such hook
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (README's test command): a worker for each core this process may run on, at most 4. The suite
    is CPU-bound once 2 workers share 2 cores (2026-12-02, BENCHMARKS.md: 27.8 min in one process, 19.0 with 2
    workers, 20.0 with 3); the cap keeps a many-core machine from starting dozens of workers, each of which spawns
    ranks of its own (not measured above 2 cores)."""
    return max(1, min(len(os.sched_getaffinity(0)), 4))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    tier_guard.begin(item)  # before any fixture of the test is set up
    try:
        return (yield)
    finally:
        tier_guard.end()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    caught = tier_guard.swallowed()
    if caught:  # the test went on after the guard's failure (a thread, a bare except): it still fails
        pytest.fail(caught[0], pytrace=False)
    return result


@pytest.fixture
def one_rank_group(tmp_path):
    """A real 1-rank gloo process group for the test (its 1-device CPU mesh is the value)."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                                         world_size=1)
    try:
        yield torch.distributed.device_mesh.init_device_mesh("cpu", (1,))
    finally:
        torch.distributed.destroy_process_group()


def _torch_switches():
    """torch's process-wide numeric switches that a test may set (through torch's own setters, never monkeypatch:
    torch serves them from its C++ state through __getattr__/properties)."""
    return (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision())


def _set_torch_switches(switches):
    if _torch_switches() != switches:  # set only what changed: torch warns on every legacy TF32 set
        torch.set_float32_matmul_precision(switches[2])  # first: it sets matmul's allow_tf32 as well
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = switches[:2]


@pytest.fixture(scope="session")
def _warm_pool():
    import warm_ranks

    pool = warm_ranks.WarmRanks()
    yield pool
    pool.close_all()
    _WARM_SUMMARY.append(f"warm ranks: {pool.jobs} runs of call_main on {pool.spawns} processes started")


_WARM_SUMMARY = []


def pytest_terminal_summary(terminalreporter):
    for line in _WARM_SUMMARY:  # how many spawns the warm ranks saved (BENCHMARKS.md, the suite's time)
        terminalreporter.write_line(line)


@pytest.fixture
def warm_ranks(_warm_pool, monkeypatch):
    """call_main's CPU ranks come from processes kept alive across tests (tests/helpers/warm_ranks.py) instead of
    fresh spawns: for tests of what ranks do, not of how they start. Use it per file:
    ``pytestmark = pytest.mark.usefixtures("warm_ranks")``."""
    from shardtrain.trainer.launch import start

    tier_guard.check("warm ranks (a process group of several ranks in processes kept alive)")
    if os.environ.get("SHARDTRAIN_TESTS_COLD_RANKS") == "1":  # fresh spawns, to tell a warm-ranks artefact apart
        return _warm_pool
    fresh = start._spawn

    def spawn(cfg, main, world_size, use_cuda):
        return fresh(cfg, main, world_size, use_cuda) if use_cuda else _warm_pool.spawn(cfg, main, world_size, False)

    monkeypatch.setattr(start, "_spawn", spawn)
    return _warm_pool


@pytest.fixture(autouse=True)
def _hygiene():
    env = dict(os.environ)
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    threads = torch.get_num_threads()
    switches = _torch_switches()
    yield
    from shardtrain.trainer.metrics.logging_setup import teardown_logging

    teardown_logging()
    logging.getLogger().setLevel(logging.WARNING)
    os.environ.clear()
    os.environ.update(env)
    torch.set_rng_state(torch_state)
    random.setstate(py_state)
    torch.set_num_threads(threads)
    _set_torch_switches(switches)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        pytest.fail("the test left a torch.distributed process group initialised")
