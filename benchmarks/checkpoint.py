"""Checkpoint save speed: sync and async sharded (DCP) saves against one torch.save.

One process, ``fully_sharded`` (a 1-rank group), a ~90M-parameter transformer_lm
with Adam state after one update. Prints GB/s for each way of saving the same
state and the training stall of ``--async-save`` (the time until the save call
returns and training may continue), as a fraction of the sync save time.

    python benchmarks/checkpoint.py [--layers 12 --dim 768 --repeats 2]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import random_data_bin  # noqa: E402

from shardtrain.config.build import parse_train_args  # noqa: E402
from shardtrain.trainer.launch import make_context  # noqa: E402
from shardtrain.trainer.loop import Run  # noqa: E402
from shardtrain.trainer.memory import state_bytes  # noqa: E402
from shardtrain.trainer.sharded_checkpoints import ShardedSaver  # noqa: E402


def build(tmp: str, layers: int, dim: int) -> Run:
    data = random_data_bin(os.path.join(tmp, "data-bin"), vocab=8000, lines=200, line_len=100)
    cfg = parse_train_args([data, "--arch", "transformer_lm", "--decoder-layers", str(layers),
                            "--decoder-embed-dim", str(dim), "--decoder-ffn-embed-dim", str(4 * dim),
                            "--decoder-attention-heads", "12", "--tokens-per-sample", "64", "--batch-size", "2",
                            "--ddp-backend", "fully_sharded", "--cpu", "--save-dir", os.path.join(tmp, "ck"),
                            "--log-format", "none"])
    run = Run(cfg, make_context(0, 0, 1, use_cuda=False, backend=None))
    itr = run.batch_iterator("train", 1, shuffle=True).next_epoch_itr()
    run.trainer.train_step([next(itr)])  # creates the Adam state
    return run


def timed_sharded(run, directory: str, name: str, async_save: bool):
    saver = ShardedSaver(async_save=async_save)
    start = time.perf_counter()
    saver.save(directory, name, run.trainer.model, run.trainer.optimizer, {"x": 1}, aliases=[])
    stall = time.perf_counter() - start
    saver.wait()
    return stall, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = build(tmp, args.layers, args.dim)
        held = state_bytes(run.trainer.params, run.trainer.optimizer)
        gb = (held["param_bytes"] + held["optim_bytes"]) / 1e9
        sync, stall, background, plain = [], [], [], []
        for i in range(args.repeats):
            sync.append(timed_sharded(run, tmp, f"sync{i}", async_save=False)[1])
            s, total = timed_sharded(run, tmp, f"async{i}", async_save=True)
            stall.append(s)
            background.append(total)
            full = run.trainer.state_dict()
            start = time.perf_counter()
            torch.save(full, os.path.join(tmp, f"plain{i}.pt"))
            plain.append(time.perf_counter() - start)
        run.close()
    sync_t, stall_t = statistics.median(sync), statistics.median(stall)
    bg_t, plain_t = statistics.median(background), statistics.median(plain)
    params = sum(p.numel() for p in run.trainer.params)
    print(f"state: {params / 1e6:.1f}M parameters, {gb:.2f} GB (parameters + Adam state), median of {args.repeats}")
    print(f"sync sharded save (DCP)   : {sync_t:6.2f} s  {gb / sync_t:5.2f} GB/s")
    print(f"async sharded save (DCP)  : {bg_t:6.2f} s  {gb / bg_t:5.2f} GB/s in the background")
    print(f"single torch.save         : {plain_t:6.2f} s  {gb / plain_t:5.2f} GB/s")
    print(f"training stall of async save: {stall_t:.2f} s = {stall_t / sync_t:.3f} x the sync save")
    print(f"RESULT async_stall_ratio={stall_t / sync_t:.3f} target<=0.2")


if __name__ == "__main__":
    main()
