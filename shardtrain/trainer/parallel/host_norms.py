"""Gradient norms on the host's cores, bit for bit what torch takes one tensor after another.

A 2-norm of one float tensor is a full reduction, which ATen's CPU norm kernel runs on one core (it splits work
by output row, and there is one): 128 MiB took 12.0 ms on 1 thread and 11.7 on 2, while the fused CPU Adam beside
it scales; for 6.7B parameters that was 1.3-2.4 s an update on the critical path. Each tensor's norm is still
taken whole by that kernel (so its bits do not change), but the tensors are spread over threads, largest first.
Below ``SPREAD_FROM`` elements in all they stay on this thread: a pool of threads started for each norm costs
~0.8-2 ms here (16 tensors of 4,096: 0.04 ms on this thread, 0.9-2.2 ms on 2; 16 of 262,144: 0.8 against 1.3-3.1; of
1M: 4.2-4.8 against 3.4-3.7), which for a small model was a third of its update (benchmarks/vs_hf_llama.py --quick).
"""
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence

import torch

from shardtrain.core.dtensors import is_dtensor
from shardtrain.core.torch_private import total_norm_of_shards


# elements (32 MiB of fp32), between where a pool lost (4.2M in all: 2.3 ms slower) and won (16.8M: 1.1 ms faster)
SPREAD_FROM = 1 << 23


def _norm(tensor: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(tensor, 2.0)


def local_norms(tensors: Sequence[torch.Tensor], threads: Optional[int] = None) -> List[torch.Tensor]:
    """``torch.linalg.vector_norm(t, 2.0)`` of each tensor, in order, on up to ``threads`` threads (default: the
    process's torch threads). An accelerator's tensors on this thread: their kernels are only queued; so are
    fewer than ``SPREAD_FROM`` elements in all, which a pool would slow down."""
    threads = torch.get_num_threads() if threads is None else threads
    if threads < 2 or len(tensors) < 2 or any(t.device.type != "cpu" for t in tensors) or \
            sum(t.numel() for t in tensors) < SPREAD_FROM:
        return [_norm(t) for t in tensors]
    largest_first = sorted(range(len(tensors)), key=lambda i: -tensors[i].numel())
    with ThreadPoolExecutor(min(threads, len(tensors)), thread_name_prefix="grad-norm") as pool:
        norms = dict(zip(largest_first, pool.map(lambda i: _norm(tensors[i]), largest_first)))
    return [norms[i] for i in range(len(tensors))]


def host_total_norm(grads: Sequence[torch.Tensor], threads: Optional[int] = None) -> Optional[torch.Tensor]:
    """The 2-norm of all ``grads`` (fp32, in host memory) as ``get_total_norm(grads, foreach=True)`` takes it
    (made whole where they are DTensors), the tensors' norms on the host's cores; None where that recipe is not
    the one torch would take (several dtypes or devices, accelerator tensors, DTensors laid out differently)."""
    if not grads or any(g.dtype != torch.float32 for g in grads):
        return None
    if all(type(g) is torch.Tensor for g in grads):
        if any(g.device.type != "cpu" for g in grads):
            return None
        return torch.linalg.vector_norm(torch.stack(local_norms(grads, threads)), 2.0)  # torch's one group
    if not all(is_dtensor(g) for g in grads):
        return None
    layouts = {(g.device_mesh, g.placements) for g in grads}
    if len(layouts) != 1 or sum(p.is_shard() for p in grads[0].placements) != 1:
        return None
    shards = [g.to_local() for g in grads]
    if any(s.device.type != "cpu" for s in shards):
        return None
    return total_norm_of_shards(local_norms(shards, threads), grads[0])
