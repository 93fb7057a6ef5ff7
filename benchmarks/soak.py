"""Soak: 2-rank fully_sharded training killed at random and resumed, against an uninterrupted run.

1. An uninterrupted reference run of ``--max-update`` updates (``shard-train``,
   2 CPU ranks, fully_sharded, dropout on, a save every ``--save-every`` updates),
   in the background.
2. Meanwhile the same run, started again and again: each launch is killed with SIGKILL
   (the whole process group: launcher and both ranks, as a node failure would)
   after a random delay, then relaunched, which resumes from checkpoint_last.
   Kills continue until ``--minutes`` have passed and ``--min-cycles`` kills
   happened; then the last launch runs to the end.
3. Checks: the final weights equal the reference's exactly (resume is exact:
   every rank's RNG, the data position and the optimizer are restored); every
   visible checkpoint directory is complete (has its COMPLETE marker and
   loads). Prints cycles survived and updates lost (done before a kill but
   after the checkpoint the next launch resumed from).

    python benchmarks/soak.py [--minutes 10 --min-cycles 10 --max-update 15000]
"""
import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import random_data_bin  # noqa: E402

from shardtrain.trainer.checkpoint.sharded import load_extra  # noqa: E402
from shardtrain.trainer.checkpoint.sharded_saver import COMPLETE  # noqa: E402


def train_cmd(data_bin: str, save_dir: str, log: str, args) -> list:
    return ["shard-train", data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "64",
            "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "2", "--tokens-per-sample", "64",
            "--batch-size", "4", "--dropout", "0.1", "--optimizer", "adam", "--lr", "1e-3",
            "--max-update", str(args.max_update), "--save-interval-updates", str(args.save_every),
            "--keep-interval-updates", "2", "--no-epoch-checkpoints", "--disable-validation",
            "--ddp-backend", "fully_sharded", "--distributed-world-size", "2", "--cpu", "--threads", "1",
            "--heartbeat-timeout", "60", "--save-dir", save_dir, "--log-format", "json", "--log-interval", "1",
            "--log-file", log, "--seed", "3"]


def last_logged_update(log: str) -> int:
    last = 0
    if os.path.exists(log):
        with open(log, errors="replace") as f:
            for line in f:
                if "| train_inner |" in line:
                    try:
                        last = int(json.loads(line.split("| train_inner | ", 1)[1])["num_updates"])
                    except (ValueError, KeyError, IndexError):
                        pass
    return last


def checkpoint_updates(save_dir: str) -> int:
    last = os.path.join(save_dir, "checkpoint_last")
    return load_extra(last)["train_state"]["num_updates"] if os.path.exists(last) else 0


def final_weights(save_dir: str, work: str) -> dict:
    out = os.path.join(work, f"{os.path.basename(save_dir)}.pt")
    subprocess.run(["shard-consolidate", os.path.join(save_dir, "checkpoint_last"), out, "--model-only"],
                   check=True, capture_output=True)
    state = torch.load(out, weights_only=True)
    return state.get("model", state)


def incomplete_dirs(save_dir: str) -> list:
    visible = [p for p in glob.glob(os.path.join(save_dir, "checkpoint*")) if os.path.isdir(p)]
    return [p for p in visible if not os.path.isfile(os.path.join(os.path.realpath(p), COMPLETE))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="keep killing for at least this long")
    parser.add_argument("--min-cycles", type=int, default=10, help="and at least this many kills")
    # enough that training outlasts --minutes of kills on a fast 2-core machine (~17 updates/s here)
    parser.add_argument("--max-update", type=int, default=15000)
    parser.add_argument("--save-every", type=int, default=25, help="--save-interval-updates")
    parser.add_argument("--kill-after", type=float, nargs=2, default=(15.0, 60.0),
                        help="a launch is killed after a uniformly random delay in this range (seconds)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="soak-")
    data_bin = random_data_bin(os.path.join(work, "data-bin"), vocab=500, lines=3000, line_len=100)

    # The reference runs alongside the soak (its result does not depend on speed: training is deterministic).
    ref_dir = os.path.join(work, "reference")
    reference = subprocess.Popen(train_cmd(data_bin, ref_dir, os.path.join(work, "reference.log"), args),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    soak_dir, cycles, lost, launches = os.path.join(work, "soak"), 0, 0, 0
    start = time.time()
    while True:
        launches += 1
        log = os.path.join(work, f"launch{launches}.log")
        proc = subprocess.Popen(train_cmd(data_bin, soak_dir, log, args), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        keep_killing = time.time() - start < args.minutes * 60 or cycles < args.min_cycles
        try:
            proc.wait(timeout=rng.uniform(*args.kill_after) if keep_killing else None)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            cycles += 1
            done, resumed = last_logged_update(log), checkpoint_updates(soak_dir)
            lost += max(0, done - resumed)
            print(f"kill {cycles:3d} at {time.time() - start:6.0f} s: {done} updates logged, "
                  f"checkpoint_last at {resumed}", flush=True)
            continue
        if proc.returncode != 0:
            sys.exit(f"launch {launches} failed with exit {proc.returncode}; see {log}")
        if checkpoint_updates(soak_dir) >= args.max_update:
            if keep_killing:
                print(f"the run reached --max-update {args.max_update} before {args.minutes:g} minutes and "
                      f"{args.min_cycles} kills: raise --max-update for this machine", flush=True)
            break
    minutes = (time.time() - start) / 60
    if reference.wait() != 0:
        sys.exit(f"the reference run failed with exit {reference.returncode}")
    ref, soak = final_weights(ref_dir, work), final_weights(soak_dir, work)
    equal = ref.keys() == soak.keys() and all(torch.equal(ref[k], soak[k]) for k in ref)
    bad = incomplete_dirs(soak_dir)
    print(f"soak: {minutes:.1f} min, {launches} launches, {cycles} kills survived, {lost} updates lost "
          f"({lost / max(cycles, 1):.1f} per kill; saves every {args.save_every})")
    print(f"final weights equal the uninterrupted run's: {equal}; incomplete checkpoint dirs: {len(bad)} {bad}")
    print(f"soak_minutes={minutes:.1f} target>=10")
    print(f"RESULT soak_cycles_survived={cycles if equal and not bad else 0} target>={args.min_cycles}")
    sys.exit(0 if equal and not bad else 1)


if __name__ == "__main__":
    main()
