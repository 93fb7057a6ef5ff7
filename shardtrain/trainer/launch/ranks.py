"""This process's place among the ranks, for code that runs with or without a
process group (checkpoint saving, random-number state): without one it is
rank 0 of 1 and the collectives are no-ops."""
from typing import Any, List, Optional

import torch.distributed as dist


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def gather_to_rank0(obj: Any) -> Optional[List[Any]]:
    """Every rank's ``obj`` (picklable), in rank order, on rank 0; None on the others.
    A collective: every rank must call it."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out
