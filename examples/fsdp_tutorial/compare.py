"""The FSDP tutorials' comparison on 2 CPU ranks: DDP against fully_sharded, with
and without size-based wrapping, with and without --cpu-offload.

    python examples/fsdp_tutorial/compare.py [--arch deep_net] [--updates 6] [--batch-size 64] [--rounds 2]

Every configuration trains the same model (Adam, the same seed and batches of
generated MNIST-style digits) for ``--updates`` updates through shard-train's
own ``Run``/``train`` with ``--cpu --distributed-world-size 2 --threads 1``.
Each configuration gets its own ``call_main``, so its two ranks are fresh
processes and no peak carries over from another row. Per rank:

- state: bytes of parameters + gradients + optimizer state the rank holds
  (local shards), right after each optimizer step (largest over updates);
- peak RSS: the rank process's ``ru_maxrss`` (includes the Python/torch
  baseline); ``above start``: peak RSS minus the peak when the rank's main
  started (torch imported, process group joined, nothing built);
- s/update: the median time of ``Trainer.train_step`` (forward, backward,
  gradient reduction, optimizer step), after the first update;
- units: the FSDP units (``fully_shard`` calls, root included).

The table gives the largest rank's figures, as memory is provisioned for the
fullest rank. With ``--rounds R`` every configuration runs R times, the order
reversed every other round, and each figure is the smallest of its R values:
the run least disturbed by other processes on the machine. It is printed as
Markdown, ready for README.md.
"""
import argparse
import logging
import os
import resource
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_mnist_idx import make_mnist_idx  # noqa: E402

from shardtrain.config.run_config import parse_train_args  # noqa: E402
from shardtrain.trainer.launch.start import call_main  # noqa: E402
from shardtrain.trainer.loop import Run, train  # noqa: E402
from shardtrain.trainer.metrics.state_memory import state_bytes  # noqa: E402

PLUGIN = os.path.join(HERE, "fsdp_tutorial")
NO_WRAP = str(10 ** 12)  # more than any model has: the root is the only unit


def configurations(min_params: int):
    fsdp = ["--ddp-backend", "fully_sharded"]
    wrap = ["--min-params-to-wrap", str(min_params)]
    return {
        "pytorch_ddp": ["--ddp-backend", "pytorch_ddp"],
        "fully_sharded, no wrapping": fsdp + ["--min-params-to-wrap", NO_WRAP],
        f"fully_sharded, size-based ({min_params:,})": fsdp + wrap,
        "fully_sharded, no wrapping, --cpu-offload": fsdp + ["--min-params-to-wrap", NO_WRAP, "--cpu-offload"],
        f"fully_sharded, size-based ({min_params:,}), --cpu-offload": fsdp + wrap + ["--cpu-offload"],
    }


def peak_rss_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB on Linux


def measure(cfg, ctx):
    """Runs on every rank: train, then gather every rank's figures; rank 0 returns them."""
    start_kb = peak_rss_kb()
    logging.getLogger().setLevel(logging.WARNING)
    run = Run(cfg, ctx)
    times, held = [], {"bytes": 0}
    step = run.trainer.train_step

    def timed_step(samples):
        start = time.perf_counter()
        out = step(samples)
        times.append(time.perf_counter() - start)
        return out

    def record_state(optimizer, args, kwargs):
        # Right after the step, before zero_grad(set_to_none=True) drops the gradients:
        # the one moment parameters, gradients and optimizer state all exist.
        held["bytes"] = max(held["bytes"], sum(state_bytes(run.trainer.params, optimizer).values()))

    run.trainer.train_step = timed_step
    run.trainer.optimizer.register_step_post_hook(record_state)
    try:
        train(run)
        units = sum(isinstance(m, FSDPModule) for m in run.trainer.model.modules())
        mine = torch.tensor([start_kb, peak_rss_kb(), held["bytes"], statistics.median(times[1:] or times)],
                            dtype=torch.float64)
        ranks = [torch.zeros_like(mine) for _ in range(ctx.world_size)]
        dist.all_gather(ranks, mine)
        params = sum(p.numel() for p in run.trainer.params)  # DTensor numel is the global size
    finally:
        run.close()
    if not ctx.is_master:
        return None
    figures = [dict(zip(("start_kb", "peak_kb", "state_bytes", "seconds"), r.tolist())) for r in ranks]
    return {"params": params, "units": units, "updates": run.trainer.num_updates, "ranks": figures}


def run_configuration(data: str, tmp: str, flags, args) -> dict:
    cfg = parse_train_args([
        data, "--user-dir", PLUGIN, "--task", "image_classification", "--criterion", "image_cross_entropy",
        "--arch", args.arch, "--batch-size", str(args.batch_size), "--optimizer", "adam", "--lr", "1e-4",
        "--lr-scheduler", "fixed", "--max-update", str(args.updates), "--no-save", "--disable-validation",
        "--log-format", "none", "--cpu", "--threads", "1", "--distributed-world-size", "2",
        "--save-dir", os.path.join(tmp, "unused"), *flags])
    return call_main(cfg, measure)


def largest_rank(result: dict) -> dict:
    ranks = result["ranks"]
    return {"state": max(r["state_bytes"] for r in ranks) / 2 ** 20, "peak": max(r["peak_kb"] for r in ranks) / 1024,
            "above": max(r["peak_kb"] - r["start_kb"] for r in ranks) / 1024,
            "seconds": max(r["seconds"] for r in ranks)}


def print_table(results: dict, args) -> None:
    first = results[next(iter(results))][0]
    print(f"\n{args.arch}: {first['params']:,} parameters, Adam, {args.updates} updates of {args.batch_size} "
          f"images per rank, 2 CPU ranks x 1 thread (gloo); largest rank, smallest of {args.rounds} round(s)\n")
    print("| configuration | FSDP units | state MB | peak RSS MB | above start MB | s/update |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rounds in results.items():
        figures = [largest_rank(result) for result in rounds]
        best = {key: min(f[key] for f in figures) for key in figures[0]}
        units = rounds[0]["units"] or "-"
        print(f"| {name} | {units} | {best['state']:,.0f} | {best['peak']:,.0f} | {best['above']:,.0f} | "
              f"{best['seconds']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="deep_net", choices=("deep_net", "shallow_net", "mnist_net"))
    parser.add_argument("--updates", type=int, default=6, help="updates per configuration (the first is not timed)")
    parser.add_argument("--batch-size", type=int, default=64, help="images per rank and update")
    parser.add_argument("--min-params-to-wrap", type=int, default=1_000_000,
                        help="the size-based rows' --min-params-to-wrap")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every configuration (smallest figures kept)")
    args = parser.parse_args()
    configs = configurations(args.min_params_to_wrap)
    results = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "mnist")
        make_mnist_idx(data, source="generated", seed=1, train_size=2 * args.batch_size * args.updates,
                       test_size=args.batch_size)
        for i in range(args.rounds):
            for name in list(configs)[::1 if i % 2 == 0 else -1]:
                start = time.perf_counter()
                result = run_configuration(data, tmp, configs[name], args)
                assert result["updates"] == args.updates
                results[name].append(result)
                print(f"round {i + 1}, {name}: {largest_rank(result)['seconds']:.2f} s/update "
                      f"(done in {time.perf_counter() - start:.0f}s)", flush=True)
    print_table(results, args)


if __name__ == "__main__":
    main()
