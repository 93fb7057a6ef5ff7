"""Random initialisation that gives the same values however a parameter is sharded.

With FSDP2 a parameter is a DTensor holding one shard per rank. Calling an
``nn.init`` function on it directly draws each shard's values from the local
RNG stream, so a sharded model would not equal the same seed's unsharded model
(on CUDA DTensor offsets the Philox stream; the CPU generator has no offsets).
Instead, ``init_`` runs the init on a full-shape scratch tensor, one parameter
at a time, and keeps the local slice: every rank draws the same sequence as a
single process does, and no rank ever holds more than one full parameter.

Sharded tensors are recognised by duck typing (``to_local``/``placements``),
so model code stays free of torch.distributed imports.
"""
from typing import Callable

import torch


@torch.no_grad()
def init_(tensor: torch.Tensor, fn: Callable, *args, **kwargs) -> None:
    """``fn(tensor, *args, **kwargs)`` (an ``nn.init``-style in-place init), sharding-independent."""
    if not _is_sharded(tensor):
        fn(tensor, *args, **kwargs)
        return
    local = tensor.to_local()
    # Drawn on the CPU generator, as an unsharded model built on the CPU and
    # then moved to its device draws them, so both give identical weights.
    full = torch.empty(tensor.shape, dtype=local.dtype, device="cpu")
    fn(full, *args, **kwargs)
    local.copy_(_local_part(full, tensor))


def _is_sharded(tensor) -> bool:
    return hasattr(tensor, "to_local") and hasattr(tensor, "placements")


def _local_part(full: torch.Tensor, tensor) -> torch.Tensor:
    """The slice of ``full`` this rank holds (torch.chunk semantics, as DTensor's Shard uses)."""
    mesh = tensor.device_mesh
    coordinate = mesh.get_coordinate()
    part = full
    for mesh_dim, placement in enumerate(tensor.placements):
        if placement.is_shard():
            chunks = torch.chunk(part, mesh.size(mesh_dim), dim=placement.dim)
            index = coordinate[mesh_dim]
            part = chunks[index] if index < len(chunks) else part.narrow(placement.dim, 0, 0)
    return part
