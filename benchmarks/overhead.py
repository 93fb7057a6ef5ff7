"""Per-step overhead of shard-train's Trainer against a bare PyTorch loop.

Both train the same model (same initial weights) on the same batches with the
same fused Adam and the same thread count. Rounds alternate between the two,
the order swapped every round (as in the 2-rank mode), so machine noise and
whatever the first loop of a pair leaves in the caches hit both alike. Ours runs ``Trainer.train_step`` plus the
loop's per-update metrics logging; the bare loop is forward, loss, backward,
step, zero_grad.

    python benchmarks/overhead.py [--steps 30 --rounds 4 --threads 2]

With ``--ranks 2``: shard-train's ``--ddp-backend fully_sharded`` against a
bare FSDP2 loop (``fully_shard`` per block, then the root, on the same mesh),
both inside the same spawned ranks, 1 thread per rank; see bench_ranks.py.

    python benchmarks/overhead.py --ranks 2 [--steps 3 --rounds 20 --threads 1]
"""
import argparse
import copy
import functools
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_data import random_data_bin  # noqa: E402
from bench_ranks import fsdp_overhead  # noqa: E402

from shardtrain.config.run_config import parse_train_args  # noqa: E402
from shardtrain.trainer.resolved import Components, build_criterion, build_model, build_task  # noqa: E402
from shardtrain.trainer.parallel.choose import build_backend  # noqa: E402
from shardtrain.trainer.launch.start import call_main, make_context  # noqa: E402
from shardtrain.trainer.precision.choose import build_precision, run_dtypes  # noqa: E402
from shardtrain.trainer.run_facts import run_facts  # noqa: E402
from shardtrain.trainer.metrics.run_metrics import RunMetrics  # noqa: E402
from shardtrain.trainer.trainer import Trainer  # noqa: E402


def setup(data: str, threads: int):
    cfg = parse_train_args([data, "--arch", "transformer_lm", "--decoder-layers", "4", "--decoder-embed-dim", "256",
                            "--decoder-ffn-embed-dim", "1024", "--decoder-attention-heads", "4",
                            "--decoder-normalize-before", "--tokens-per-sample", "256", "--batch-size", "8",
                            "--optimizer", "adam", "--lr", "1e-4", "--clip-norm", "0", "--threads", str(threads)])
    torch.manual_seed(0)
    components = Components.of(cfg)
    task = build_task(cfg, components)
    model = build_model(cfg, components, task)
    criterion = build_criterion(cfg, components, task)
    itr = task.get_batch_iterator("train", max_tokens=None, max_sentences=8, seed=1).next_epoch_itr()
    return cfg, task, model, criterion, [next(itr) for _ in range(8)]


class Ours:
    def __init__(self, cfg, task, model, criterion):
        backend = build_backend(cfg, make_context(0, 0, 1, use_cuda=False, backend=None), run_dtypes(cfg))
        # The benchmark's own model as built (not prepare_model's seeded init): the one process's wrap only.
        precision = build_precision(cfg, backend, run_dtypes(cfg))
        self.trainer = Trainer(cfg, Components.of(cfg), task, backend.wrap(model), criterion, backend, precision,
                               run_facts(cfg, Components.of(cfg), 1, 1, type(backend)))
        self.metrics = RunMetrics(torch.device("cpu"))

    def step(self, batch):
        out = self.trainer.train_step([batch])
        self.metrics.log_update(self.trainer.criterion, out, self.trainer.num_updates)


class Bare:
    def __init__(self, model, pad: int):
        self.model, self.pad = model, pad
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)

    def step(self, batch):
        self.model.train()
        logits = self.model(batch["net_input"]["src_tokens"])
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch["target"].view(-1),
                               ignore_index=self.pad, reduction="sum") / batch["ntokens"]
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def timed(runner, batches, steps: int) -> float:
    start = time.perf_counter()
    for i in range(steps):
        runner.step(batches[i % len(batches)])
    return time.perf_counter() - start


def run_ranks(args):
    """shard-train fully_sharded vs a bare FSDP2 loop on ``args.ranks`` CPU ranks (gloo)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = parse_train_args([
            random_data_bin(os.path.join(tmp, "data-bin")), "--arch", "transformer_lm", "--decoder-layers", "4",
            "--decoder-embed-dim", "256", "--decoder-ffn-embed-dim", "1024", "--decoder-attention-heads", "4",
            "--decoder-normalize-before", "--tokens-per-sample", "256", "--batch-size", str(args.batch_size),
            # no dropout and a fixed lr: both loops then compute bit-identical weights, which the ranks check
            "--dropout", "0", "--optimizer", "adam", "--lr", "1e-4", "--lr-scheduler", "fixed", "--clip-norm", "0",
            "--ddp-backend", "fully_sharded", "--distributed-world-size", str(args.ranks), "--cpu",
            "--threads", str(args.threads), "--no-save", "--disable-validation", "--log-format", "none",
            "--save-dir", os.path.join(tmp, "unused")])
        r = call_main(cfg, functools.partial(fsdp_overhead, steps=args.steps, rounds=args.rounds))
    steps = r["steps"] * len(r["t_ours"])
    wps_ours, wps_bare = (steps * r["tokens_per_step"] / sum(r[t]) for t in ("t_ours", "t_bare"))
    # Paired rounds ran back to back, so a burst of load from another process hits one pair;
    # the median over pairs ignores it where the totals would not.
    pair_ratios = sorted(b / o for o, b in zip(r["t_ours"], r["t_bare"]))
    print(f"ranks={args.ranks} threads/rank={r['threads']} steps={steps} global tokens/step="
          f"{r['tokens_per_step']:.0f} params={r['params']:,}")
    print(f"identical weights before training: {r['same_init']}, after: {r['same_final']}")
    print(f"bare FSDP2 loop         : {wps_bare:10.0f} words/s  ({1000 * sum(r['t_bare']) / steps:.1f} ms/step)")
    print(f"shardtrain fully_sharded: {wps_ours:10.0f} words/s  ({1000 * sum(r['t_ours']) / steps:.1f} ms/step)")
    print(f"ratio of totals {wps_ours / wps_bare:.3f}; per pair of rounds: "
          + " ".join(f"{x:.3f}" for x in pair_ratios))
    print(f"RESULT fsdp_overhead_ratio={statistics.median(pair_ratios):.3f} target>=0.95")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="steps per round (default: 30; 3 with --ranks)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per loop (default: 4; 20 with --ranks)")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: 2; per rank with --ranks: 1)")
    parser.add_argument("--ranks", type=int, default=1, help="> 1: fully_sharded vs bare FSDP2 on that many ranks")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per rank per step (with --ranks)")
    args = parser.parse_args()
    if args.ranks > 1:
        args.steps, args.rounds, args.threads = args.steps or 3, args.rounds or 20, args.threads or 1
        return run_ranks(args)
    args.steps, args.rounds, args.threads = args.steps or 30, args.rounds or 4, args.threads or 2
    with tempfile.TemporaryDirectory() as tmp:
        cfg, task, model, criterion, batches = setup(random_data_bin(os.path.join(tmp, "data-bin")), args.threads)
        torch.set_num_threads(args.threads)
        ours = Ours(cfg, task, copy.deepcopy(model), criterion)
        bare = Bare(copy.deepcopy(model), task.dictionary.pad())
        tokens_per_step = sum(b["ntokens"] for b in batches) / len(batches)
        timed(ours, batches, 3), timed(bare, batches, 3)  # warm-up
        rounds = []  # (ours, bare) seconds per round
        for r in range(args.rounds):
            if r % 2 == 0:
                t_ours = timed(ours, batches, args.steps)
                t_bare = timed(bare, batches, args.steps)
            else:
                t_bare = timed(bare, batches, args.steps)
                t_ours = timed(ours, batches, args.steps)
            rounds.append((t_ours, t_bare))
    n = args.steps * args.rounds
    t_ours, t_bare = (sum(r[k] for r in rounds) for k in (0, 1))
    wps_ours, wps_bare = n * tokens_per_step / t_ours, n * tokens_per_step / t_bare
    print(f"threads={args.threads} steps={n} tokens/step={tokens_per_step:.0f} "
          f"params={sum(p.numel() for p in model.parameters()):,}")
    print(f"bare loop : {wps_bare:10.0f} words/s  ({1000 * t_bare / n:.1f} ms/step)")
    print(f"shardtrain: {wps_ours:10.0f} words/s  ({1000 * t_ours / n:.1f} ms/step)")
    print("per round, bare time / ours (odd rounds ran the bare loop first): "
          + " ".join(f"{b / o:.3f}" for o, b in rounds))
    print(f"RESULT overhead_ratio={wps_ours / wps_bare:.3f} target>=0.97")


if __name__ == "__main__":
    main()
