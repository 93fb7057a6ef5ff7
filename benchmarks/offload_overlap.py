"""The CPU optimizer during backward, against after it, on a stand-in accelerator (issue 39, item 3).

The stand-in: a model of ``--blocks`` blocks whose parameters, gradients and cpu_adam's state are in host
memory, as under ``--cpu-offload``. Each block's backward waits in a sleep, releasing the CPU as a rank does
while its GPU computes; its own CPU compute is made small (one row of activations). The wait is the measured
CPU step of one block's parameters, so that backward takes as long as the CPU step, the case the issue names.
Then the block's reduced gradient "lands" in host memory as FSDP2 lands it under offload
(``foreach_reduce`` in torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): the first micro-batch's
becomes ``.grad`` (a buffer the copy engine wrote: refreshed before each update, outside the timing), a later
micro-batch's is added to it on the CPU, and the parameter's post-accumulate-grad hooks are called, as FSDP2
calls them. The blocks are plain modules, not FSDP2 units: on a CPU "device" FSDP2's gathers and reductions
are host copies that would take the CPU a GPU leaves free, and hide what is measured here (tests/trainer/
parallel/test_step_in_backward.py checks the FSDP2 path, its order and its bits).

Both ways run in this process, alternating, from the same start: ``during`` (shardtrain's default:
trainer/parallel/step_in_backward.py steps each block's shards as its gradient lands) and ``after``
(``--cpu-step after-backward``: every shard once backward has ended). The figure is the ratio of median step
times, at ``--update-freq 1`` (the target) and 4 (only the last micro-batch's backward can hide the step).

    python benchmarks/offload_overlap.py [--blocks 8 --width 1536 --updates 7]
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from shardtrain.optim.cpu_adam import CPUAdam  # noqa: E402
from shardtrain.trainer.parallel.step_in_backward import StepInBackward  # noqa: E402

TARGET = 0.7


class _OnTheAccelerator(torch.autograd.Function):
    """A block computed elsewhere: forward passes the activations on; backward waits (the accelerator computing
    the block's backward), then lands the block's gradient on the host as FSDP2 does (see the module doc)."""

    @staticmethod
    def forward(ctx, x, block):
        ctx.block = block
        return x.clone()

    @staticmethod
    def backward(ctx, grad_out):
        block = ctx.block
        time.sleep(block.wait)
        weight = block.weight
        if weight.grad is None:
            weight.grad = block.landed  # the copy engine wrote it: no CPU work
        else:
            weight.grad += block.landed_again  # accumulation: a CPU add, as FSDP2's under offload
        for hook in (getattr(weight, "_post_accumulate_grad_hooks", None) or {}).values():  # as FSDP2 calls them
            hook(weight)
        return grad_out, None


class Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(width, width) / width)
        self.pristine = torch.randn(width, width, generator=torch.Generator().manual_seed(width)) * 1e-3
        self.landed, self.landed_again = torch.empty_like(self.pristine), torch.empty_like(self.pristine)
        self.wait = 0.0

    def land(self) -> None:
        """What the device's copies write, before each update (not timed: DMA, not the CPU)."""
        self.landed.copy_(self.pristine)
        self.landed_again.copy_(self.pristine)

    def forward(self, x):
        # The weight is not an input: autograd has no accumulation node for it (FSDP2's sharded parameters are
        # not in the graph either), the landing above is its only gradient and hook call.
        return _OnTheAccelerator.apply(x, self)


def build(blocks: int, width: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block(width) for _ in range(blocks)])
    params = list(model.parameters())
    return model, params, CPUAdam(params, lr=1e-4)


def one_block_step_seconds(width: int, repeats: int = 5) -> float:
    """The median CPU work of one block's parameters in an update after backward, as the Trainer does it
    (what each block's wait is set to): the gradient's norm (``--cpu-step after-backward`` takes it over every
    gradient, the step during backward shard by shard) and the fused CPU Adam step with the update's
    multiplier (the kernel writes the multiplied gradient back). The gradient is re-landed before each."""
    p = torch.nn.Parameter(torch.randn(width, width))
    pristine = torch.randn(width, width) * 1e-3
    p.grad = pristine.clone()
    optimizer = CPUAdam([p], lr=1e-4)
    optimizer.step()  # the state is created once
    times = []
    for _ in range(repeats):
        p.grad.copy_(pristine)
        start = time.perf_counter()
        torch.nn.utils.get_total_norm([p.grad], foreach=True)
        optimizer.grad_multiplier = 1e-3
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def update(model, params, optimizer, overlap, batches, multiplier: float) -> float:
    """One update as the Trainer makes it (trainer/trainer.py): seconds from its first forward to its step's end."""
    for block in model:
        block.land()
    start = time.perf_counter()
    for i, x in enumerate(batches):
        last = i == len(batches) - 1
        if last and overlap is not None:
            overlap.arm(multiplier)
        model(x).sum().backward()
    if overlap is not None:
        overlap.finish()
        overlap.grad_norm()
        overlap.commit(multiplier)
    else:
        torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True)  # the backend's, for plain tensors
        optimizer.grad_multiplier = multiplier
        optimizer.step()
    seconds = time.perf_counter() - start
    optimizer.zero_grad(set_to_none=True)  # as the Trainer: the next update's first gradient is assigned
    return seconds


def measure(blocks: int, width: int, update_freq: int, wait: float, updates: int):
    ways = {}
    for name in ("during", "after"):
        model, params, optimizer = build(blocks, width)
        for block in model:
            block.wait = wait
        # keep=False: no --clip-norm, bf16 or fp32 (nothing can undo the update: no copies are kept)
        overlap = StepInBackward(optimizer, params, keep=False, device=torch.device("cpu")) if name == "during" \
            else None
        ways[name] = (model, params, optimizer, overlap, [])
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(1, width, generator=gen).requires_grad_() for _ in range(update_freq)]
    for u in range(updates + 1):  # the first update of each creates Adam's state: left out
        for name, (model, params, optimizer, overlap, times) in ways.items():
            seconds = update(model, params, optimizer, overlap, batches, 1.0 / (1000 * update_freq))  # 1/tokens
            if u:
                times.append(seconds)
    # the same start, the same batches and the same kernel: the two ways must end with the same weights
    during, after = ways["during"][1], ways["after"][1]
    assert all(torch.equal(a, b) for a, b in zip(during, after)), "the two ways differ"
    return {name: statistics.median(w[4]) for name, w in ways.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=1536)
    parser.add_argument("--updates", type=int, default=7)
    args = parser.parse_args(argv)
    wait = one_block_step_seconds(args.width)
    print(f"{args.blocks} blocks of {args.width}x{args.width} ({args.width * args.width / 1e6:.2f}M "
          f"parameters each), {torch.get_num_threads()} threads; one block's CPU work after backward {wait * 1e3:.1f} ms, "
          f"so each block's backward waits as long (the norm and the step)")
    ratios = {}
    for update_freq in (1, 4):
        t = measure(args.blocks, args.width, update_freq, wait, args.updates)
        ratios[update_freq] = t["during"] / t["after"]
        print(f"--update-freq {update_freq}: during backward {t['during'] * 1e3:.0f} ms, after it "
              f"{t['after'] * 1e3:.0f} ms a step: ratio {ratios[update_freq]:.3f}")
    print(f"RESULT offload_overlap_step_ratio_update_freq_4={ratios[4]:.3f} target<=1.0")
    print(f"RESULT offload_overlap_step_ratio={ratios[1]:.3f} target<={TARGET}")


if __name__ == "__main__":
    main()
