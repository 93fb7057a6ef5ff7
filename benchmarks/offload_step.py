"""The CPU work after backward under ``--fp16 --cpu-offload --optimizer cpu_adam``: before and after
folding the gradient multiplier into the fused Adam kernel.

Before (shardtrain until issue 12): unscale the CPU gradients (one pass), take the global norm
(one pass), clip (one more pass when clipping fires), then Adam. After: the norm, then Adam, whose
kernel divides each gradient by ``grad_scale`` as it reads it, so unscaling, 1/sample size and the
clip coefficient cost no pass of their own. Both run here on the same fp32 tensors (the sharded
gradients and parameters of a ``--params``-parameter model on one rank), alternating, and the
median step time of each is compared.

    python benchmarks/offload_step.py [--params 100e6 --repeats 7 --threads 2]
"""
import argparse
import statistics
import time

import torch

from shardtrain.optim.cpu_adam import CPUAdam

TENSORS = 64  # a model's shard is many tensors: per-tensor overheads count too


def make(n: int):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n // TENSORS, generator=gen)) for _ in range(TENSORS)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen) * 1000.0  # loss-scaled gradients
    return params, CPUAdam(params, lr=1e-4)


def before(params, optimizer, multiplier, clip):
    for p in params:  # unscale
        p.grad.mul_(multiplier)
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)
    torch.nn.utils.clip_grads_with_norm_(params, clip, norm, foreach=True)  # clip (fires)
    optimizer.step()


def after(params, optimizer, multiplier, clip):
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True) * multiplier
    optimizer.grad_multiplier = multiplier * min(1.0, clip / (float(norm) + 1e-6))
    optimizer.step()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    params, optimizer = make(int(args.params))
    times = {"before": [], "after": []}
    grads = [p.grad.clone() for p in params]
    for _ in range(args.repeats):
        for name, step in (("before", before), ("after", after)):
            for p, g in zip(params, grads):
                p.grad.copy_(g)
            start = time.perf_counter()
            step(params, optimizer, 1 / (128 * 4096), 1e-3)
            times[name].append(time.perf_counter() - start)
    b, a = statistics.median(times["before"]), statistics.median(times["after"])
    n = sum(p.numel() for p in params)
    print(f"{n / 1e6:.0f}M fp32 parameters on the CPU, {args.threads} threads, median of {args.repeats}")
    print(f"before (unscale, norm, clip, Adam): {b * 1e3:.0f} ms ({28 * n / b / 1e9:.1f} GB/s of Adam's 28 B/param)")
    print(f"after  (norm, Adam with grad_scale): {a * 1e3:.0f} ms; after/before {a / b:.3f}")
    print(f"RESULT offload_step_ratio={a / b:.3f} target<=0.80")


if __name__ == "__main__":
    main()
