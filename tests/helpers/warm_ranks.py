"""Warm ranks: one set of spawned CPU ranks kept alive across many tests, as PyTorch's MultiProcContinuousTest
and DeepSpeed's reuse_dist_env keep theirs.

Starting 2 gloo ranks costs seconds (each process imports torch and shardtrain); most tests that spawn ranks
test what the ranks do, not how they start. For those, ``call_main``'s spawn step is replaced (the
``warm_ranks`` fixture in conftest.py) by handing the same ``(rank, cfg, main, plan)`` to processes that are
already running, which then run ``start._spawned_rank`` -- the code a freshly spawned rank runs: the thread
policy, a fresh process group through a fresh ``file://`` rendezvous, main, the result or failure report in
the run directory. A fresh rank would inherit the test's environment, working directory and sys.path at the
moment it starts: each job carries those of the moment it is handed over. What a warm rank does not share with a
fresh one is the rest of the process-wide state left by the last job: each job starts from the signal handlers,
logging, thread count and torch's default random generator the worker started with, and a job that failed ends its worker (its process group may be half torn down), so the next job gets fresh
processes. Tests whose subject is starting, signalling or killing ranks keep real spawns (tests/trainer/launch/).
"""
import logging
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import torch
import torch.multiprocessing as mp

from shardtrain.trainer.launch import rendezvous, start, supervise

# A job that has run this long is stuck (a collective waiting for a peer): the pool is killed and the test
# fails. Generous: the suite runs on loaded machines (st_testutils.scaled stretches in-test limits likewise).
JOB_TIMEOUT_S = 900.0
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def _worker(rank: int, jobs, done) -> None:
    """A warm rank: run each job as a freshly spawned rank would, then put the process back as it was."""
    threads, generator = torch.get_num_threads(), torch.get_rng_state()  # a fresh process's default seed
    handlers = {s: signal.getsignal(s) for s in SIGNALS}
    while True:
        job = jobs.recv()
        if job is None:
            return
        cfg, main, plan, (env, cwd, path) = job
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.path[:] = path
        torch.set_rng_state(generator)
        try:
            start._spawned_rank(rank, cfg, main, plan)  # writes the result, or the failure report and raises
        except BaseException:  # noqa: BLE001 - reported in the run directory; end with a fresh process next time
            done.send(False)
            os._exit(1)
        finally:
            from shardtrain.trainer.metrics.logging_setup import teardown_logging

            teardown_logging()
            logging.getLogger().setLevel(logging.WARNING)
        if torch.distributed.is_initialized():  # _run_rank destroys the group on success: a job that did not
            done.send(False)
            os._exit(1)
        torch.set_num_threads(threads)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        done.send(True)


class WarmRanks:
    """Processes of each world size, started on first use and reused until one fails or the session ends."""

    def __init__(self):
        self._pools: Dict[int, list] = {}
        self.spawns = 0  # processes started, for the test that these are reused
        self.jobs = 0

    def spawn(self, cfg, main, world_size: int, use_cuda: bool):
        """``start._spawn``'s contract: run main on ``world_size`` ranks, return rank 0's result or raise the
        failure ``supervise`` would pick."""
        assert not use_cuda, "warm ranks are CPU ranks; CUDA runs spawn as usual"
        backend = rendezvous.resolve_backend(cfg.distributed.distributed_backend, use_cuda)
        pool = self._pool(world_size)
        self.jobs += 1
        with tempfile.TemporaryDirectory(prefix="shardtrain-warm-ranks-") as run_dir:
            init_method = cfg.distributed.distributed_init_method or "file://" + os.path.join(run_dir, "rendezvous")
            plan = start._SpawnPlan(world_size, backend, init_method, use_cuda, run_dir, time.time())
            surroundings = (dict(os.environ), os.getcwd(), list(sys.path))
            for _, jobs, _ in pool:
                jobs.send((cfg, main, plan, surroundings))
            failed, timed_out = self._wait(pool, JOB_TIMEOUT_S)
            if timed_out:
                self.close(world_size)
                raise TimeoutError(f"warm ranks: the job on {world_size} ranks ran past {JOB_TIMEOUT_S:.0f} s "
                                   f"(ranks {timed_out} still running); the ranks were killed")
            if failed:
                processes = [p for p, _, _ in pool]
                self.close(world_size)
                raise supervise._failure(run_dir, processes, failed)
            return supervise.read_result(run_dir)

    def _pool(self, world_size: int) -> list:
        if world_size not in self._pools:
            context = mp.get_context("spawn")
            pool = []
            for rank in range(world_size):
                jobs_here, jobs_there = context.Pipe()
                done_there, done_here = context.Pipe()
                process = context.Process(target=_worker, args=(rank, jobs_there, done_there), daemon=True)
                process.start()
                jobs_there.close()
                done_there.close()
                pool.append((process, jobs_here, done_here))
            self.spawns += world_size
            self._pools[world_size] = pool
        return self._pools[world_size]

    @staticmethod
    def _wait(pool, timeout_s: float) -> Tuple[List[int], List[int]]:
        """The ranks that failed (all that did, once the others have had a moment), and those still running at
        the deadline; ([], []) when every rank is done."""
        pending = dict(enumerate(pool))
        failed: List[int] = []
        deadline = time.monotonic() + timeout_s
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return sorted(failed), sorted(pending)
            waits = {}
            for rank, (process, _, done) in pending.items():
                waits[done] = rank
                waits[process.sentinel] = rank
            ready = multiprocessing.connection.wait(list(waits), timeout=min(left, 10.0) if failed else left)
            if failed and not ready:  # the rest are waiting on the failed rank: they are its consequence
                return sorted(failed), []
            for handle in ready:
                rank = waits[handle]
                if rank not in pending:
                    continue
                process, _, done = pending.pop(rank)
                ok = False
                if handle is done or done.poll():
                    try:
                        ok = done.recv()
                    except EOFError:
                        ok = False
                if not ok:
                    failed.append(rank)
        return sorted(failed), []

    def close(self, world_size: int) -> None:
        pool = self._pools.pop(world_size, [])
        for process, jobs, _ in pool:  # all asked first, then waited for together
            try:
                jobs.send(None)
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 5.0
        for process, _, _ in pool:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()

    def close_all(self) -> None:
        for world_size in list(self._pools):
            self.close(world_size)
