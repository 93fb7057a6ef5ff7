"""CPUAdam's master-copy path for parameters on the GPU (pinned, double-buffered copies).

Equality: GPU fp32/bf16 parameters stepped by CPUAdam, chunked finely (many chunks,
a partial last one, a transposed tensor stepped whole), equal torch.optim.AdamW on
CPU fp32 copies over several steps (bf16: the fp32 master rounded to bf16).
Timing: one step of a ~100M-element parameter, pipelined against the sequential
copies the path used before (pageable memory, synchronous); printed, and the
pipelined step must not be more than 10% slower.
"""
import functools
import statistics
import time

import pytest
import torch

from conftest import needs_gpus
from shardtrain.optim import cpu_adam as cpu_adam_module
from shardtrain.optim.chunk_pipe import ChunkPipe
from shardtrain.optim.cpu_adam import CPUAdam

SHAPES = [(37, 290), (10001,), (3, 5, 170), ()]
LR, WD, STEPS = 1e-2, 0.1, 10


def _device() -> torch.device:
    return torch.accelerator.current_accelerator()


def _start(dtype):
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(s, generator=gen) for s in SHAPES] + [torch.randn(13, 70, generator=gen).t()]
    return [v.to(dtype).float() for v in values]


def _grads(step, shapes, dtype):
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(s, generator=gen).to(dtype).float() for s in shapes]


@needs_gpus(1)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpu_params_equal_torch_adamw_on_cpu(dtype, monkeypatch):
    monkeypatch.setattr(cpu_adam_module, "_CHUNK_NUMEL", 1000)
    start = _start(dtype)
    # .t() of a contiguous device copy keeps the transposed (non-contiguous) layout on the GPU.
    params = [torch.nn.Parameter(v.to(_device(), dtype)) for v in start[:-1]]
    params.append(torch.nn.Parameter(start[-1].t().contiguous().to(_device(), dtype).t()))
    ref = [torch.nn.Parameter(v.clone()) for v in start]
    optimizer = CPUAdam(params, lr=LR, weight_decay=WD)
    reference = torch.optim.AdamW(ref, lr=LR, weight_decay=WD, foreach=False, fused=False)
    for step in range(STEPS):
        for p, r, g in zip(params, ref, _grads(step, [r.shape for r in ref], dtype)):
            p.grad, r.grad = g.to(_device(), dtype), g.clone()
        optimizer.step()
        reference.step()
    for p, r in zip(params, ref):
        got, expected = p.detach().cpu().float(), r.detach().to(dtype).float()
        assert p.device.type == _device().type and p.dtype == dtype
        # fp32: kernels may differ in the last bit; bf16: that may flip one rounding.
        tolerance = 1e-6 if dtype == torch.float32 else torch.finfo(dtype).eps
        assert (got - expected).abs().max() <= tolerance * expected.abs().max().clamp_min(1e-12)
    moved = max((p.detach().cpu().float() - v).abs().max().item() for p, v in zip(params, _start(dtype)))
    assert moved > 1e-3, "the parameters did not move"


def _step_seconds(optimizer, repeats=3) -> float:
    optimizer.step()  # warm-up: state and buffers allocated
    times = []
    for _ in range(repeats):
        torch.accelerator.synchronize()
        began = time.perf_counter()
        optimizer.step()
        torch.accelerator.synchronize()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


@needs_gpus(1)
def test_pipelined_copies_are_not_slower_than_sequential(monkeypatch):
    param = torch.nn.Parameter(torch.randn(100 << 20, device=_device()))
    param.grad = torch.randn_like(param)
    seconds = {}
    for name, staged in (("sequential", False), ("pipelined", True)):
        monkeypatch.setattr(cpu_adam_module, "ChunkPipe", functools.partial(ChunkPipe, staged=staged))
        seconds[name] = _step_seconds(CPUAdam([param], lr=1e-4))
    print(f"CPUAdam master-copy step, {param.numel() / 1e6:.0f}M fp32 elements on {_device()}: "
          f"sequential {seconds['sequential']:.3f}s, pipelined {seconds['pipelined']:.3f}s "
          f"({seconds['sequential'] / seconds['pipelined']:.2f}x)")
    assert seconds["pipelined"] <= 1.1 * seconds["sequential"]
