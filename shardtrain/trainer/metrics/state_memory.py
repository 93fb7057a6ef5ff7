"""Bytes of training state this rank holds: parameters, gradients, optimizer state.

For sharded (DTensor) tensors only the local shard counts, which is what
differs between backends and what --cpu-offload moves off the accelerator.
"""
from typing import Dict, Iterable

import torch


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def state_bytes(params: Iterable[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> Dict[str, int]:
    params = list(params)
    optim = sum(_local_bytes(v) for state in optimizer.state.values() for v in state.values()
                if torch.is_tensor(v) and v.dim() > 0)  # 0-d tensors are step counters
    return {
        "param_bytes": sum(_local_bytes(p) for p in params),
        "grad_bytes": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
        "optim_bytes": optim,
    }


def state_gb(params, optimizer) -> Dict[str, float]:
    """The same, in GiB (like every memory figure in the log records) for
    ``param_gb``, ``grad_gb``, ``optim_gb``."""
    return {k.replace("_bytes", "_gb"): round(v / 2**30, 4) for k, v in state_bytes(params, optimizer).items()}
