"""The fast tier's guard: a test not marked ``slow`` may not start a process, a process group of more than one
rank, or a training run (conftest.py installs it; ``python -m pytest -m "not slow" tests`` is the fast tier).

Membership is decided by mechanism, not by timing: a timing rule would move tests in and out of the tier with
the machine's load. Each mechanism is caught where every route to it passes:
- a process: ``subprocess.Popen`` (``run``, ``check_output``, ...), ``multiprocessing``'s ``Process.start``
  (``torch.multiprocessing.spawn``, process pools; the spawn start method bypasses Popen), ``os.fork``,
  and ``os.posix_spawn``/``posix_spawnp``;
- a process group of more than one rank: ``torch.distributed.init_process_group`` with a world size above 1
  (the argument, or ``WORLD_SIZE`` as torchrun sets it); torch's fake backend, one process tracing as many
  ranks (shard-plan), is not one;
- a training run: ``shardtrain.trainer.loop.train``, the epochs of every entry point (shard-train, -hydra-train,
  -demo, shard-plan --verify); a refused run never gets there.
The guard raises pytest's failure (a BaseException: an ``except Exception`` in the code under test cannot swallow
it) and also records it, so a test that swallowed it anyway (a thread, a bare except) fails when its call ends.
"""
import multiprocessing.process
import os
import subprocess

import pytest
import torch.distributed

MARK = "slow"
ADVICE = (f"mark the test @pytest.mark.{MARK} (the fast tier, -m 'not {MARK}', starts no process, no process group "
          "of more than one rank and no training run)")


class _State:
    guarded = False  # True while a test not marked slow runs (its fixtures included)
    violations: list = []


def check(what: str) -> None:
    if _State.guarded:
        message = f"{what}: {ADVICE}"
        _State.violations.append(message)
        pytest.fail(message, pytrace=False)


def _wrap(owner, name: str, what, condition=lambda *a, **k: True) -> None:
    original = getattr(owner, name)

    def guarded(*args, **kwargs):
        if condition(*args, **kwargs):
            check(what(*args, **kwargs) if callable(what) else what)
        return original(*args, **kwargs)

    guarded.__wrapped__ = original
    setattr(owner, name, guarded)


def _world_size(*args, **kwargs) -> int:
    """The ranks a real group would start (0 for torch's fake backend: shard-plan traces on one, no process)."""
    if kwargs.get("backend", args[0] if args else None) == "fake":
        return 0
    size = kwargs.get("world_size", args[3] if len(args) > 3 else -1)
    if size is None or size == -1:
        size = int(os.environ.get("WORLD_SIZE", "1"))
    return int(size)


def _command(self, args, *rest, **kwargs) -> str:
    shown = args if isinstance(args, (str, bytes)) else " ".join(map(str, list(args)[:3]))
    return f"the test starts a process ({shown})"


def install() -> None:
    """Wrap each mechanism once per session (idempotent)."""
    if getattr(subprocess.Popen.__init__, "__wrapped__", None):
        return
    _wrap(subprocess.Popen, "__init__", _command)
    _wrap(multiprocessing.process.BaseProcess, "start", "the test starts a process (multiprocessing)")
    for name in ("fork", "posix_spawn", "posix_spawnp"):  # not os.system: tests pickle it as a payload
        if hasattr(os, name):
            _wrap(os, name, f"the test starts a process (os.{name})")
    _wrap(torch.distributed, "init_process_group",
          lambda *a, **k: f"the test starts a process group of {_world_size(*a, **k)} ranks",
          lambda *a, **k: _world_size(*a, **k) > 1)
    from shardtrain.trainer import loop

    _wrap(loop, "train", "the test starts a training run (shardtrain.trainer.loop.train)")


def begin(item) -> None:
    _State.guarded = item.get_closest_marker(MARK) is None
    _State.violations = []


def end() -> None:
    _State.guarded = False


def swallowed() -> list:
    """The violations of the test that just ran (non-empty after a call that passed: it swallowed them)."""
    return list(_State.violations)
