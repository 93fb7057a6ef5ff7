"""Running shard-train on the visible GPUs for the GPU scenarios, with its JSON records read back."""
import json
import os
import re
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from make_data import write_dictionary, write_split  # noqa: E402


def learnable_data_bin(directory: str, vocab: int = 50_000, tokens: int = 2_000_000, seed: int = 0) -> str:
    """A data-bin whose loss can fall: each token is a fixed function of the one before
    (one of 4 successors), so a model learns it in tens of updates. Random tokens
    (benchmarks/make_data.py) cannot show a "decreasing loss"."""
    if os.path.exists(os.path.join(directory, "valid.idx")):
        return directory  # safe to run twice
    d = write_dictionary(directory, vocab)
    rng = np.random.RandomState(seed)
    successors = rng.randint(d.nspecial, len(d), size=(len(d), 4))
    for split, count in (("train", tokens), ("valid", tokens // 50)):
        ids = np.empty(count, dtype=np.int64)
        ids[0], choice = d.nspecial, rng.randint(0, 4, size=count)
        for i in range(1, count):
            ids[i] = successors[ids[i - 1], choice[i]]
        write_split(directory, split, d, np.array_split(ids, max(count // 1000, 1)))
    return directory


class RunFailed(RuntimeError):
    pass


def train(data_bin: str, workdir: str, name: str, flags: List[str], timeout: int = 900) -> Dict:
    """One shard-train run; returns its train_inner/train/valid records, wall time and log path."""
    log = os.path.join(workdir, f"{name}.log")
    save_dir = os.path.join(workdir, f"{name}-ck")
    argv = [sys.executable, "-m", "shardtrain.cli.train", data_bin, "--save-dir", save_dir, "--log-file", log,
            "--log-format", "json", "--log-interval", "1", *flags]
    if os.path.exists(log):
        os.remove(log)  # a second run of the suite starts clean
    start = time.time()
    print(f"---- {' '.join(argv)}", flush=True)
    # Its output goes straight to ours (run_all.py's run.log) as it is written: held in memory, a run killed at
    # its timeout lost all of it, and the --log-file is in the workdir run_all.py deletes (issue 45, 2.5).
    code = subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=timeout).returncode
    print(f"---- {name}: exit {code}", flush=True)
    if code != 0:
        raise RunFailed(f"{name}: exit {code} (its output is in run.log, above)\n{' '.join(argv)}")
    return {"records": records(log), "seconds": time.time() - start, "log": log, "skipped": skipped_updates(log),
            "params": model_params(log)}


# What shardtrain/trainer/parallel/prepare.py logs of the model it built (fairseq's line)
PARAMS_LINE = re.compile(r" \| num\. model params: ([\d,]+) ")


def model_params(log: str) -> int:
    """The built model's parameter count, from the run's --log-file (0: not logged, which fails a target)."""
    with open(log) as f:
        found = [PARAMS_LINE.search(line) for line in f]
    counts = [int(m.group(1).replace(",", "")) for m in found if m]
    return counts[0] if counts else 0


# What shardtrain/trainer/precision/loss_scaler.py logs for each fp16 update it skips (its gradient overflowed): a
# skipped update writes no train_inner record and does not count towards --max-update.
OVERFLOW_LINE = " | shardtrain.trainer.precision.loss_scaler | gradient overflow detected"


def skipped_updates(log: str) -> int:
    """Updates the loss scaler skipped (fp16 overflow), from the run's --log-file."""
    with open(log) as f:
        return sum(OVERFLOW_LINE in line for line in f)


def records(log: str) -> Dict[str, List[Dict]]:
    """JSON records by tag (train_inner, train, valid), numbers as floats."""
    out: Dict[str, List[Dict]] = {}
    with open(log) as f:
        for line in f:
            parts = line.rstrip("\n").split(" | ", 3)
            if len(parts) == 4 and parts[3].startswith("{"):
                out.setdefault(parts[2], []).append({k: _number(v) for k, v in json.loads(parts[3]).items()})
    return out


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value
