"""Soak: a run that heals itself. 2 CPU ranks under ``torchrun --max-restarts``, fully_sharded with
--async-save and --spike-rollback, on data whose batches are poisoned now and then (soak_plugin/),
killed at random for --minutes.

1. Kills: mostly SIGKILL of one rank (a random one), which torchrun answers by restarting the group,
   which resumes from checkpoint_last by itself; every --whole-job-every-th kill SIGKILLs the whole
   job (torchrun and its ranks, as a lost node), which this script relaunches as a scheduler's
   requeue would. Poisoned batches spike the loss and are rolled back on every rank.
2. After --minutes: SIGTERM to torchrun (a preemption: the ranks save checkpoint_last and stop), then
   the job is relaunched to finish at a round update count U, uninterrupted.
3. The reference: the same command and data, never killed, without --spike-rollback, with
   --skip-batches set to the windows the soak's final checkpoint records as rolled back. Its weights
   must equal the soak's bit for bit (every kill lost nothing but time, every rollback skipped exactly
   what it says), and every visible checkpoint directory must be complete.

    python benchmarks/soak_selfheal.py [--minutes 20]
"""
import argparse
import glob
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_data import random_data_bin  # noqa: E402
from soak import final_weights, incomplete_dirs, last_logged_update  # noqa: E402 - the first soak's readers

from shardtrain.data.batch_windows import format_windows  # noqa: E402
from shardtrain.trainer.checkpoint.sharded import load_extra  # noqa: E402

UNBOUNDED = 10 ** 7  # --max-update while the kills go on: the end is chosen afterwards


def train_args(data_bin: str, save_dir: str, log: str, args, max_update: int) -> list:
    return [data_bin, "--task", "lm_poisoned", "--user-dir", os.path.join(HERE, "soak_plugin"),
            "--poison-every", str(args.poison_every), "--arch", "transformer_lm", "--decoder-layers", "2",
            "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "2",
            "--tokens-per-sample", "64", "--batch-size", "4", "--dropout", "0.1", "--optimizer", "adam",
            "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
            "--max-update", str(max_update), "--save-interval-updates", str(args.save_every),
            "--keep-interval-updates", "2", "--no-epoch-checkpoints", "--disable-validation",
            "--ddp-backend", "fully_sharded", "--async-save", "--cpu", "--threads", "1", "--heartbeat-timeout",
            "120", "--save-dir", save_dir, "--log-format", "json", "--log-interval", "1", "--log-file", log,
            "--seed", "3"]


SPIKE = ["--spike-rollback", "--spike-window", "20", "--spike-snapshot-interval", "10", "--spike-factor", "1.5",
         "--spike-gnorm-factor", "5", "--spike-max-rollbacks", "5"]


def torchrun(argv: list, restarts: int, output: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", str(restarts), "-m", "shardtrain.cli.train", *argv]
    with open(output, "a") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def children(pid: int) -> list:
    """The processes whose parent is ``pid`` (torchrun's ranks)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.split("/")[2]))
    return found


def checkpoint_extra(save_dir: str) -> dict:
    last = os.path.join(save_dir, "checkpoint_last")
    return load_extra(last) if os.path.exists(last) else {}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="kill at random for this long")
    parser.add_argument("--kill-after", type=float, nargs=2, default=(15.0, 45.0),
                        help="the next kill comes after a uniformly random delay in this range (seconds)")
    parser.add_argument("--whole-job-every", type=int, default=4, help="every N-th kill takes the whole job")
    parser.add_argument("--poison-every", type=int, default=1201, help="see soak_plugin/ (~1 update in 150)")
    parser.add_argument("--save-every", type=int, default=25, help="--save-interval-updates")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="soak-selfheal-")
    data_bin = random_data_bin(os.path.join(work, "data-bin"), vocab=500, lines=3000, line_len=100)
    soak_dir, log, output = os.path.join(work, "soak"), os.path.join(work, "soak.log"), os.path.join(work, "out")
    soak_args = train_args(data_bin, soak_dir, log, args, UNBOUNDED) + SPIKE
    print(f"work dir {work}", flush=True)

    start, kills, rank_kills, job_kills, launches, lost = time.time(), 0, 0, 0, 0, 0
    job = None
    while time.time() - start < args.minutes * 60:
        if job is None or job.poll() is not None:
            if job is not None:
                sys.exit(f"the job ended by itself (exit {job.returncode}) while it should train on; see {output}")
            job, launches = torchrun(soak_args, restarts=10 ** 6, output=output), launches + 1
        time.sleep(rng.uniform(*args.kill_after))
        if job.poll() is not None:
            continue  # reported at the top of the loop
        done, saved = last_logged_update(log), checkpoint_extra(soak_dir).get("train_state", {}).get("num_updates", 0)
        kills += 1
        if kills % args.whole_job_every == 0:  # a lost node: torchrun and its ranks at once (torchrun
            # starts each rank in a session of its own, so killing torchrun's process group leaves them running)
            for pid in [job.pid, *children(job.pid)]:
                os.kill(pid, signal.SIGKILL)
            job.wait()
            job, job_kills, what = None, job_kills + 1, "the whole job"
        else:
            ranks = children(job.pid)
            if not ranks:
                continue  # between attempts: torchrun is restarting the group
            os.kill(rng.choice(ranks), signal.SIGKILL)
            rank_kills, what = rank_kills + 1, "one rank"
        lost += max(0, done - saved)
        print(f"kill {kills:3d} ({what}) at {time.time() - start:6.0f} s: update {done} logged, checkpoint_last at "
              f"{saved}", flush=True)

    # A preemption ends the kills: torchrun passes SIGTERM on, the ranks save checkpoint_last and stop.
    if job is not None and job.poll() is None:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=300)
    minutes = (time.time() - start) / 60
    stopped_at = checkpoint_extra(soak_dir)["train_state"]["num_updates"]
    end = (stopped_at // 50 + 2) * 50
    finish = torchrun(train_args(data_bin, soak_dir, log, args, end) + SPIKE, restarts=0, output=output)
    if finish.wait() != 0:
        sys.exit(f"the finishing launch failed (exit {finish.returncode}); see {output}")
    extra = checkpoint_extra(soak_dir)
    guard = extra.get("spike_guard", {})
    windows = [tuple(w) for w in guard.get("skipped", [])]
    print(f"soak: {minutes:.1f} min of kills, {kills} kills ({rank_kills} of one rank, restarted by torchrun; "
          f"{job_kills} of the whole job, relaunched), {launches + 1} launches, {lost} updates lost "
          f"({lost / max(kills, 1):.1f} per kill; saves every {args.save_every}); preempted at update {stopped_at}, "
          f"finished at {end}; {len(windows)} rollbacks in the final lineage, skipping {format_windows(windows)}",
          flush=True)

    ref_dir = os.path.join(work, "reference")
    ref_args = train_args(data_bin, ref_dir, os.path.join(work, "reference.log"), args, end)
    if windows:
        ref_args += ["--skip-batches", format_windows(windows)]
    reference = torchrun(ref_args, restarts=0, output=os.path.join(work, "reference.out"))
    if reference.wait() != 0:
        sys.exit(f"the reference run failed with exit {reference.returncode}; see {work}/reference.out")
    ref, soak = final_weights(ref_dir, work), final_weights(soak_dir, work)
    equal = ref.keys() == soak.keys() and all(torch.equal(ref[k], soak[k]) for k in ref)
    bad = incomplete_dirs(soak_dir)
    healthy = equal and not bad and extra["train_state"]["num_updates"] == end and windows
    print(f"final weights equal the reference that skips the same windows: {equal}; incomplete checkpoint dirs: "
          f"{len(bad)} {bad}")
    print(f"soak_kills={kills} soak_rollbacks={len(windows)}")
    print(f"RESULT soak_selfheal_minutes={minutes if healthy else 0:.1f} target>={args.minutes:g}")
    sys.exit(0 if healthy else 1)


if __name__ == "__main__":
    main()
