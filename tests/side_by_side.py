"""Training processes that a signal test stops, run side by side.

Each such test waits for a fresh shard-train (its torch import, its ranks' start) before it can send its signal:
seconds of one core each. Started together, the runs of a test module overlap those waits, and the tests then
check what each run left. The time budgets are the idle ones times the number of runs sharing the cores, and
scaled by the load when they start (a budget only ends a run that hangs)."""
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from st_testutils import scaled

UNDER_WAY = '"num_updates": "3"'  # the json log's third train_inner record: training is under way


def train_command(data, save, ranks: int) -> list:
    """shard-train of a tiny model on ``ranks`` CPU ranks that runs until it is stopped."""
    return [sys.executable, "-m", "shardtrain.cli.train", data, "--arch", "transformer_lm", "--decoder-layers",
            "2", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "2",
            "--tokens-per-sample", "32", "--batch-size", "4", "--disable-validation", "--max-update", "100000",
            "--cpu", "--threads", "1", "--log-format", "json", "--log-interval", "1", "--save-dir", str(save),
            "--distributed-world-size", str(ranks), "--ddp-backend", "fully_sharded" if ranks > 1 else "c10d"]


class Budget:
    """Idle-machine seconds, stretched by the load when the runs start and by how many share the cores."""

    def __init__(self, sharing: int):
        self.sharing, self.factor = sharing, scaled(1.0) * sharing

    def __call__(self, seconds: float) -> float:
        return seconds * self.factor


def start_under_way(command, budget: Budget, **popen) -> subprocess.Popen:
    """Start ``command`` and return once its third update is logged (or its budget is spent: the test's
    own check of the updates then fails)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.time() + budget(60)
    for line in proc.stdout:
        if UNDER_WAY in line or time.time() > deadline:
            break
    return proc


def finish(proc: subprocess.Popen, timeout: float):
    """(stdout, stderr) once ``proc`` ends; one that outlasts ``timeout`` is killed (its session too, when it
    leads one), so that a hung run leaves nothing behind to load the tests after it."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        (os.killpg if os.getsid(proc.pid) == proc.pid else os.kill)(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


class Outcome:
    """What one run returned, or the exception it raised (raised again where a test reads it)."""

    def __init__(self, future):
        try:
            self.value, self.error = future.result(), None
        except Exception as e:  # noqa: BLE001 - the test of this run fails with it, the others go on
            self.value, self.error = None, e

    def get(self):
        if self.error is not None:
            raise self.error
        return self.value


def run_side_by_side(runs: dict) -> dict:
    """{name: Outcome} of calling each of ``runs`` (name -> function of no arguments) in a thread of its own."""
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {name: pool.submit(run) for name, run in runs.items()}
    return {name: Outcome(future) for name, future in futures.items()}
