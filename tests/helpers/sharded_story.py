"""One trained sharded checkpoint and the runs that resume it, shared by test_sharded_checkpoints.py and
test_consolidate.py (made once per session: each spawn of ranks costs seconds, the tiny runs do not).

The global batch is the same at every world size (ranks x --update-freq = 6 batches per update), so a
run resumed from the first HALF of the updates must reproduce an uninterrupted run's last updates. Every
2-rank run sits in one of two spawns: the first halves, then (after in-process copies and conversions) the
resumes. Each run in a spawn starts from generators re-seeded apart, as a fresh process would, so state
that a resume fails to restore is not carried over from the run before.
"""
import functools
import os
import random
import shutil

import numpy as np
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from equivalence_mains import train_and_record
from st_testutils import make_space_data_bin

TOTAL, HALF = 8, 4
_cache: dict = {}


def data_bin(tmp_path_factory) -> str:
    if "data" not in _cache:
        _cache["data"] = make_space_data_bin(str(tmp_path_factory.mktemp("ckpt")), n_words=8, train_tokens=8000,
                                             valid_tokens=200, line_len=40)
    return _cache["data"]


def config(data, save_dir, world_size, max_update, backend="fully_sharded", dropout="0", *extra):
    return parse_train_args([
        data, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--required-batch-size-multiple", "1", "--dropout", dropout, "--optimizer", "sgd",
        "--momentum", "0.9", "--lr", "0.5", "--lr-scheduler", "fixed", "--max-update", str(max_update),
        "--disable-validation", "--cpu", "--threads", "1", "--log-format", "none", "--save-dir", str(save_dir),
        "--ddp-backend", backend, "--distributed-world-size", str(world_size),
        "--update-freq", str(6 // world_size), "--heartbeat-timeout", "60", *extra])


def run(data, save_dir, world_size, max_update, backend="fully_sharded", dropout="0", *extra):
    """(per-update losses, full final weights, bytes held) of one run, on rank 0."""
    return call_main(config(data, save_dir, world_size, max_update, backend, dropout, *extra), train_and_record)


def train_each(cfgs, cfg, ctx):
    """Every rank: train each of ``cfgs`` in turn in this one process group; rank 0 returns their results."""
    results = []
    for i, each in enumerate(cfgs):
        seed = 1000 + 10 * i + ctx.rank  # what a fresh process would hold: not the last run's state
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        results.append(train_and_record(each, ctx))
    return results


def run_all(named: dict) -> dict:
    """{name: rank 0's train_and_record result} of ``named`` ({name: cfg}, one world size), in one spawn."""
    cfgs = list(named.values())
    return dict(zip(named, call_main(cfgs[0], functools.partial(train_each, cfgs))))


def copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def first_halves(tmp_path_factory) -> dict:
    """The checkpoints every resume starts from, and what was seen of them before any resume touched them."""
    if "first" in _cache:
        return _cache["first"]
    data, root = data_bin(tmp_path_factory), tmp_path_factory.mktemp("story")
    dirs = {name: root / name for name in ("two", "straight", "split", "async", "single", "one")}
    run(data, dirs["one"], 1, HALF)  # in this process: a checkpoint saved by one rank
    one_rank_is_sharded = os.path.isdir(dirs["one"] / "checkpoint_last")
    results = run_all({
        "two": config(data, dirs["two"], 2, HALF),  # never written to again: copied where a test changes it
        "straight": config(data, dirs["straight"], 2, TOTAL, "fully_sharded", "0.2"),
        "split": config(data, dirs["split"], 2, HALF, "fully_sharded", "0.2"),
        "async": config(data, dirs["async"], 2, HALF, "fully_sharded", "0", "--async-save",
                        "--save-interval-updates", "1", "--keep-interval-updates", "2"),
        "single": config(data, dirs["single"], 2, HALF, "pytorch_ddp")})
    async_names = sorted(p.name for p in dirs["async"].iterdir())
    async_last = os.readlink(dirs["async"] / "checkpoint_last")
    single_is_file = (dirs["single"] / "checkpoint_last.pt").is_file()
    # shard-consolidate's round trip: directory -> full-state file -> directory
    from shardtrain.cli import consolidate

    full, back = root / "full.pt", root / "resharded"
    consolidate.main([str(dirs["two"] / "checkpoint_last"), str(full)])
    consolidate.main([str(full), str(back)])
    _cache["first"] = dict(data=data, root=root, dirs=dirs, results=results, one_rank_is_sharded=one_rank_is_sharded,
                           async_names=async_names, async_last=async_last, single_is_file=single_is_file,
                           full=full, back=back)
    return _cache["first"]


def resumes(tmp_path_factory) -> dict:
    """{name: losses of the updates after HALF} of every 2-rank resume, from one spawn."""
    if "resumes" in _cache:
        return _cache["resumes"]
    first = first_halves(tmp_path_factory)
    data, root, dirs = first["data"], first["root"], first["dirs"]
    results = run_all({
        "two": config(data, copy(dirs["two"], root / "two_resumed"), 2, TOTAL),
        "one": config(data, dirs["one"], 2, TOTAL),
        "split": config(data, dirs["split"], 2, TOTAL, "fully_sharded", "0.2"),
        "async": config(data, dirs["async"], 2, TOTAL, "fully_sharded", "0", "--async-save"),
        "sharded_to_ddp": config(data, copy(dirs["two"], root / "to_ddp"), 2, TOTAL, "pytorch_ddp"),
        "single_to_sharded": config(data, dirs["single"], 2, TOTAL),
        "round_trip": config(data, root / "round_trip", 2, TOTAL, "fully_sharded", "0",
                             "--restore-file", str(first["back"]))})
    _cache["resumes"] = {name: result[0] for name, result in results.items()}
    return _cache["resumes"]
