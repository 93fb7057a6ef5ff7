"""--async-save on 2 CPU ranks: host peak memory and training stall, against a sync save.

Each way of saving runs in its own pair of fresh gloo ranks (so memory one way
leaves behind is not charged to the next), on the same fully_sharded
transformer_lm with Adam state:

  sync   : the sync sharded save (DCP writes the live tensors);
  dcp    : --async-save as first built, DCP's own stager: a fresh copy of everything per save;
  copy   : a copy of everything into the run's one buffer, made once and reused;
  split  : --async-save now: CPU parameters and optimizer state are written live
           and the next optimizer step waits for the write; the rest is copied.

dcp and copy are built in checkpoint_baselines.py from the product's pieces.

For an async save the stall is what training loses to it: the time until
save() returns, plus how much longer the update that overlaps the background
write takes than a normal update. Host peak is the sum over the ranks of
each one's largest resident set (sampled every 5 ms) during the save, from
save() until the write has landed.

    python benchmarks/async_save.py [--layers 6 --dim 640 --saves 3]
"""
import argparse
import functools
import os
import statistics
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_baselines import CopyEverythingSaver, DcpStagerSaver  # noqa: E402
from make_data import random_data_bin  # noqa: E402

from shardtrain.config.run_config import parse_train_args  # noqa: E402
from shardtrain.trainer.launch.start import call_main  # noqa: E402
from shardtrain.trainer.loop import Run  # noqa: E402
from shardtrain.trainer.metrics.state_memory import state_bytes  # noqa: E402
from shardtrain.trainer.checkpoint.sharded_saver import ShardedSaver  # noqa: E402


class PeakRSS:
    """The largest resident set of this process while inside the ``with`` block."""

    def __enter__(self):
        self.peak, self._stop = rss(), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def summed(value: float) -> float:
    total = torch.tensor(float(value), dtype=torch.float64)
    dist.all_reduce(total)
    return float(total)


def slowest(value: float) -> float:
    worst = torch.tensor(float(value), dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


SAVERS = {"sync": ShardedSaver, "split": lambda: ShardedSaver(async_save=True), "copy": CopyEverythingSaver,
          "dcp": DcpStagerSaver}


def measure(mode, saves, cfg, ctx):
    """Per rank: build, warm up, then ``saves`` saves each with one update after save() returns."""
    run = Run(cfg, ctx)
    itr = run.batch_iterator("train", 1, shuffle=True).next_epoch_itr()

    def update():
        start = time.perf_counter()
        run.trainer.train_step([next(itr)])
        return time.perf_counter() - start

    update()  # Adam state exists and the step is warm
    normals = []
    saver = SAVERS[mode]()
    held = state_bytes(run.trainer.params, run.trainer.optimizer)
    rows = []
    for i in range(saves):
        normal = statistics.median(update() for _ in range(3))  # just before: other load on the machine drifts
        normals.append(normal)
        before = rss()
        with PeakRSS() as peak:
            start = time.perf_counter()
            saver.save(cfg.checkpoint.save_dir, f"{mode}{i}", run.trainer.model, run.trainer.optimizer,
                       {"x": 1}, aliases=[])
            returned = time.perf_counter() - start
            overlapped = update()
            saver.wait()
            total = time.perf_counter() - start
        stall = returned if mode == "sync" else returned + max(0.0, overlapped - normal)
        rows.append((slowest(returned), slowest(stall), slowest(total), summed(before), summed(peak.peak),
                     slowest(overlapped - normal)))
    saver.close()
    run.close()
    state = summed(held["param_bytes"] + held["optim_bytes"])
    return {"rows": rows, "normal": slowest(statistics.median(normals)), "state": state}


def config(tmp, data, layers, dim):
    return parse_train_args([data, "--arch", "transformer_lm", "--decoder-layers", str(layers),
                             "--decoder-embed-dim", str(dim), "--decoder-ffn-embed-dim", str(4 * dim),
                             "--decoder-attention-heads", "8", "--tokens-per-sample", "32", "--batch-size", "2",
                             "--ddp-backend", "fully_sharded", "--cpu", "--threads", "1", "--optimizer", "adam",
                             "--distributed-world-size", "2", "--save-dir", tmp, "--log-format", "none",
                             "--no-save", "--disable-validation", "--heartbeat-timeout", "300"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--dim", type=int, default=640)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="each mode this often, in alternating order")
    args = parser.parse_args()
    modes = ("sync", "dcp", "copy", "split")
    results = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        data = random_data_bin(os.path.join(tmp, "data-bin"), vocab=8000, lines=200, line_len=100)
        for r in range(args.rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                save_dir = os.path.join(tmp, f"{mode}{r}")
                cfg = config(save_dir, data, args.layers, args.dim)
                results[mode].append(call_main(cfg, functools.partial(measure, mode, args.saves)))
    report(results)


def report(results):
    """Medians over rounds and saves (the first save of each run, which allocates, shown apart)."""
    gb, med = 1e9, statistics.median
    sync_rows = [row for run in results["sync"] for row in run["rows"]]
    # a sync save's time is until save() returns (the write is done then); its total also holds
    # the update after it, which is no part of the save
    sync_time, sync_peak = med(r[0] for r in sync_rows), med(r[4] for r in sync_rows)
    first = results["sync"][0]
    print(f"state on 2 ranks: {first['state'] / gb:.2f} GB (parameters + Adam); normal update "
          f"{med(run['normal'] for run in results['sync']):.2f} s; sync save {sync_time:.2f} s, "
          f"host peak {sync_peak / gb:.2f} GB (medians of {len(sync_rows)})")
    ratios = {}
    labels = {"dcp": "DCP's stager, a copy per save", "copy": "one reused copy", "split": "live CPU state, gated step"}
    for mode, label in labels.items():
        for name, rows in (("first", [run["rows"][0] for run in results[mode]]),
                           ("later", [row for run in results[mode] for row in run["rows"][1:]])):
            if not rows:
                continue
            returned, stall, total, before, peak, slower = (med(r[k] for r in rows) for k in range(6))
            print(f"{label:30s} {name} saves: save() returns {returned:.3f} s, overlapped update +{slower:.3f} s, "
                  f"stall {stall:.3f} s = {stall / sync_time:.3f} x sync; written after {total:.2f} s; host "
                  f"{before / gb:.2f} -> peak {peak / gb:.2f} GB = {peak / sync_peak:.2f} x sync peak")
        every = [row for run in results[mode] for row in run["rows"]]
        ratios[mode] = (med(r[1] for r in every) / sync_time, max(r[4] for r in every) / sync_peak)
    for mode, suffix in (("dcp", "_dcp_stager"), ("copy", "_copy"), ("split", "")):
        print(f"RESULT async_save_stall_ratio{suffix}={ratios[mode][0]:.3f} target<=0.2")
        print(f"RESULT async_save_host_peak_ratio{suffix}={ratios[mode][1]:.2f} target<=1.25")


if __name__ == "__main__":
    main()
