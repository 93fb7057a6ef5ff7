"""The gradient norm on the host's cores (shardtrain/trainer/parallel/host_norms.py) against today's
``torch.nn.utils.get_total_norm(grads, foreach=True)``, on the same fp32 gradients in host memory.

A 2-norm of one tensor runs on one core in ATen's kernel (a full reduction is split by output row, and there is
one), so host_norms spreads the tensors over the threads instead: the speed-up is bounded by the threads, the
memory bandwidth and the largest tensor. Both are timed in turn, the order swapped every round; the figure is
the median over rounds of torch's time / ours. The bits are checked equal every round.

    python benchmarks/grad_norm.py [--numel 200000000 --tensors 9 --rounds 7]

The default is one block of transformer_lm_gpt3_6_7 (~200M parameters in 9 tensors: FSDP2 hands a block's
shards over together). With all threads (torch's default) the last line is the result:

    RESULT grad_norm_speedup=<torch's time / host_norms' time> target>=1.5

(1.5 on a node of 16 cores; a 2-core machine can reach at most 2 and, memory-bound, less.)
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from shardtrain.trainer.parallel.host_norms import host_total_norm  # noqa: E402

# transformer_lm_gpt3_6_7's block (4096 wide, 16384 FFN): q, k, v, out, fc1, fc2 weights and 3 small ones,
# as fractions of the block's parameters
SHAPES = [1, 1, 1, 1, 4, 4]


def gradients(numel: int, tensors: int):
    weights = (SHAPES * ((tensors + len(SHAPES) - 1) // len(SHAPES)))[:tensors]
    sizes = [max(1, numel * w // sum(weights)) for w in weights]
    return [torch.randn(n) for n in sizes]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--numel", type=int, default=200_000_000)
    parser.add_argument("--tensors", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    grads = gradients(args.numel, args.tensors)
    today = lambda: torch.nn.utils.get_total_norm(grads, foreach=True)  # noqa: E731
    ours = lambda: host_total_norm(grads)  # noqa: E731
    ratios = []
    for r in range(args.rounds):
        pair = (today, ours) if r % 2 == 0 else (ours, today)
        (t_a, n_a), (t_b, n_b) = timed(pair[0]), timed(pair[1])
        assert torch.equal(n_a, n_b), (n_a, n_b)  # the same bits, every round
        t_today, t_ours = (t_a, t_b) if r % 2 == 0 else (t_b, t_a)
        ratios.append(t_today / t_ours)
        print(f"round {r}: get_total_norm {t_today * 1e3:.1f} ms, host_norms {t_ours * 1e3:.1f} ms")
    print(f"{sum(g.numel() for g in grads) / 1e6:.0f}M parameters in {len(grads)} tensors, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")
    print(f"RESULT grad_norm_speedup={statistics.median(ratios):.2f} target>=1.5")


if __name__ == "__main__":
    main()
