"""Checkpoint save speed: sync and async sharded (DCP) saves against one torch.save.

One process, ``fully_sharded`` (a 1-rank gloo group), a ~97M-parameter
transformer_lm with Adam state. The saves are measured by async_save.py's
``measure`` (the same code as the 2-rank --async-save benchmark): after a
warm-up update, each save is followed by one training update, which for
``--async-save`` overlaps the background write. So the stall of an async save
is what training loses to it: the time until save() returns plus how much
longer that overlapping update takes than a normal one (the median of the 3
updates just before the save). The sync save's time is until save() returns
(the write has landed). Sync and async alternate over ``--rounds``, each in a
freshly built run; one torch.save of the trainer's full state dict is timed
on a run of its own. Then the cost of checksums: sharded saves with and without them (the baseline in
checkpoint_baselines.py), alternating, each loaded back; and checking a single file's zip CRCs against its torch.load.

    python benchmarks/checkpoint.py [--layers 12 --dim 768 --saves 2 --rounds 2]
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from async_save import measure  # noqa: E402
from checkpoint_baselines import SaverWithoutChecksums  # noqa: E402
from make_data import random_data_bin  # noqa: E402

from shardtrain.config.run_config import parse_train_args  # noqa: E402
from shardtrain.trainer.checkpoint.contents import trainer_parts  # noqa: E402
from shardtrain.trainer.checkpoint.sharded import ShardedDirectory  # noqa: E402
from shardtrain.trainer.checkpoint.sharded_saver import ShardedSaver  # noqa: E402
from shardtrain.trainer.checkpoint.single_file import SingleFile  # noqa: E402
from shardtrain.trainer.launch.start import make_context  # noqa: E402
from shardtrain.trainer.loop import Run  # noqa: E402


def config(tmp: str, data: str, save_dir: str, layers: int, dim: int):
    return parse_train_args([data, "--arch", "transformer_lm", "--decoder-layers", str(layers),
                             "--decoder-embed-dim", str(dim), "--decoder-ffn-embed-dim", str(4 * dim),
                             "--decoder-attention-heads", "12", "--tokens-per-sample", "64", "--batch-size", "2",
                             "--ddp-backend", "fully_sharded", "--cpu", "--optimizer", "adam",
                             "--save-dir", save_dir, "--log-format", "none", "--no-save", "--disable-validation"])


def plain_save_seconds(cfg, ctx, path: str, repeats: int):
    """-> (the median time of one torch.save of the trainer's full state after one update, the median time
    of checking its zip CRCs over that of torch.load: a single file's load overhead)."""
    run = Run(cfg, ctx)
    run.trainer.train_step([next(run.batch_iterator("train", 1, shuffle=True).next_epoch_itr())])
    times, verify, load = [], [], []
    for _ in range(repeats):
        full = run.trainer.state_dict()
        start = time.perf_counter()
        torch.save(full, path)
        times.append(time.perf_counter() - start)
        verify.append(timed(SingleFile().verify, path))
        load.append(timed(torch.load, path, weights_only=True))
        os.remove(path)
    run.close()
    return statistics.median(times), statistics.median(verify) / statistics.median(load)


def timed(f, *args, **kwargs) -> float:
    start = time.perf_counter()
    f(*args, **kwargs)
    return time.perf_counter() - start


def checksum_overheads(cfg, ctx, repeats: int):
    """-> {"save", "load": median time with checksums / median time without - 1}: sharded saves by
    ShardedSaver and SaverWithoutChecksums in alternating order, each loaded back (resume's read_state +
    load_tensors) into the same run; a checkpoint saved without checksums has no CHECKSUMS to verify."""
    run = Run(cfg, ctx)
    run.trainer.train_step([next(run.batch_iterator("train", 1, shuffle=True).next_epoch_itr())])
    parts = trainer_parts(run.trainer)
    times = {(op, on): [] for op in ("save", "load") for on in (True, False)}
    # One saver per mode for the whole run, as a training run has: the first save with checksums makes
    # the gloo group their gather uses, which a run pays once; an untimed first save takes it here.
    savers = {True: ShardedSaver(), False: SaverWithoutChecksums()}
    for on, saver in savers.items():
        shutil.rmtree(saver.save(cfg.checkpoint.save_dir, f"warmup{on}", run.trainer.model, run.trainer.optimizer,
                                 {"x": 1}, aliases=[]))
    for i in range(repeats):
        for on in (True, False) if i % 2 == 0 else (False, True):
            saver = savers[on]
            start = time.perf_counter()
            path = saver.save(cfg.checkpoint.save_dir, f"sums{on}{i}", run.trainer.model, run.trainer.optimizer,
                              {"x": 1}, aliases=[])
            times["save", on].append(time.perf_counter() - start)
            fmt = ShardedDirectory()
            start = time.perf_counter()
            fmt.load_tensors(path, fmt.read_state(path), parts["model"], parts["optimizer"])
            times["load", on].append(time.perf_counter() - start)
            shutil.rmtree(path)
    for saver in savers.values():
        saver.close()
    run.close()
    med = statistics.median
    return {op: med(times[op, True]) / med(times[op, False]) - 1 for op in ("save", "load")}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--saves", type=int, default=2, help="saves per run, each with one update after it")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, in alternating order")
    parser.add_argument("--checksum-repeats", type=int, default=4, help="sharded saves and loads with and "
                                                                        "without checksums, each")
    args = parser.parse_args()
    ctx = make_context(0, 0, 1, use_cuda=False, backend=None)
    results = {"sync": [], "split": []}  # "split" is --async-save as shipped
    with tempfile.TemporaryDirectory() as tmp:
        data = random_data_bin(os.path.join(tmp, "data-bin"), vocab=8000, lines=200, line_len=100)
        # Ours, so that Run.close() leaves it to measure()'s last collectives (a 1-rank group)
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'pg')}", rank=0, world_size=1)
        try:
            for r in range(args.rounds):
                for mode in ("sync", "split") if r % 2 == 0 else ("split", "sync"):
                    cfg = config(tmp, data, os.path.join(tmp, f"{mode}{r}"), args.layers, args.dim)
                    results[mode].append(measure(mode, args.saves, cfg, ctx))
            plain = plain_save_seconds(config(tmp, data, os.path.join(tmp, "plain"), args.layers, args.dim), ctx,
                                       os.path.join(tmp, "plain.pt"), args.rounds * args.saves)
            sums = checksum_overheads(config(tmp, data, os.path.join(tmp, "sums"), args.layers, args.dim), ctx,
                                      args.checksum_repeats)
        finally:
            dist.destroy_process_group()
    report(results, plain[0])
    print(f"single file: checking its zip CRCs takes {plain[1]:.3f} x its torch.load")
    print(f"RESULT checksum_save_overhead={sums['save']:.3f} target<=0.05")
    print(f"RESULT checksum_load_overhead={sums['load']:.3f} target<=0.10")


def report(results, plain: float):
    med = statistics.median
    rows = {mode: [row for run in runs for row in run["rows"]] for mode, runs in results.items()}
    gb = results["sync"][0]["state"] / 1e9
    normal = med(run["normal"] for runs in results.values() for run in runs)
    sync = med(r[0] for r in rows["sync"])  # save() returned: the write has landed
    returned, stall, landed, slower = (med(r[k] for r in rows["split"]) for k in (0, 1, 2, 5))
    print(f"state: {gb:.2f} GB (parameters + Adam state), 1 process x {torch.get_num_threads()} threads; a normal "
          f"update {normal:.2f} s; medians of {len(rows['sync'])} saves per mode")
    print(f"sync sharded save (DCP)      : {sync:6.2f} s  {gb / sync:5.2f} GB/s")
    print(f"async sharded save (DCP)     : {landed:6.2f} s  {gb / landed:5.2f} GB/s (from save() until the write "
          f"landed, with one training update running alongside)")
    print(f"single torch.save            : {plain:6.2f} s  {gb / plain:5.2f} GB/s")
    print(f"training stall of async save : save() returns {returned:.2f} s + overlapped update slower by "
          f"{slower:.2f} s = {stall:.2f} s = {stall / sync:.3f} x the sync save")
    print(f"RESULT async_stall_ratio={stall / sync:.3f} target<=0.2")


if __name__ == "__main__":
    main()
