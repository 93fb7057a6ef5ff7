"""Building blocks of the fully_sharded backend, each with explicit arguments."""
import ctypes
from typing import List, Optional

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from shardtrain.core.errors import ConfigError
from shardtrain.models import capabilities
from shardtrain.trainer.offload_times import attach_upload_timer
from shardtrain.trainer.parallel.upload_ahead import DeviceStreams, UploadAhead, uploads_ahead


def shard_group_size(world_size: int, requested: Optional[int], ranks_per_node: int) -> int:
    """--shard-group-size, else a node's ranks (the launch counted them: ``DistributedContext.ranks_per_node``)."""
    if requested is not None:
        return requested
    return min(ranks_per_node, world_size)


def build_mesh(ctx, strategy: str, group_size: Optional[int]):
    """1-D mesh for full_shard/shard_grad_op; 2-D (replicate, shard) for the others."""
    world = ctx.world_size
    if strategy in ("full_shard", "shard_grad_op"):
        return init_device_mesh(ctx.device.type, (world,), mesh_dim_names=("shard",))
    size = 1 if strategy == "no_shard" else shard_group_size(world, group_size, ctx.ranks_per_node)
    if size < 1 or world % size != 0:
        raise ConfigError(f"--fsdp-sharding-strategy {strategy} shards within groups of --shard-group-size "
                          f"{size} ranks, which does not divide the world size {world}. Choose a group size "
                          f"that divides {world}, or change --distributed-world-size.")
    return init_device_mesh(ctx.device.type, (world // size, size), mesh_dim_names=("replicate", "shard"))


def size_based_units(model: nn.Module, min_params: int) -> List[nn.Module]:
    """For models without ``blocks``: post-order, a module becomes an FSDP unit once
    the parameters not yet in a unit below it reach ``min_params`` (fairseq's policy)."""
    units = []

    def visit(module: nn.Module) -> int:
        remaining = sum(p.numel() for p in module.parameters(recurse=False))
        for child in module.children():
            remaining += visit(child)
        if module is not model and remaining >= min_params:
            units.append(module)
            return 0
        return remaining

    visit(model)
    return units


def reshards_after_forward(distributed) -> bool:
    """Whether each block frees its gathered parameters after forward (and gathers them again in
    backward): not for --no-reshard-after-forward nor the ZeRO-2-like strategies."""
    zero2_like = distributed.fsdp_sharding_strategy in ("shard_grad_op", "hybrid_shard_zero2")
    return not (distributed.no_reshard_after_forward or zero2_like)


def offload_policy(cpu_offload: bool, device: torch.device):
    """Shards on the CPU under --cpu-offload, pinned only when they travel to a GPU:
    pinning allocates through CUDA, so a --cpu run on a GPU machine would create a
    CUDA context (and hold GPU driver memory) for nothing."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy  # here: FSDP2 (with DTensor) is 1.6 s to import
    if not cpu_offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=device.type == "cuda")


def apply_fsdp(model: nn.Module, mesh, mp_policy, *, reshard_after_forward: bool,
               offload, min_params_to_wrap: int) -> nn.Module:
    """fully_shard every block (or size-based unit), then the root; set up prefetching.

    Order matters: inner units first, so the root's unit holds only what is
    left (embeddings, final norm, output projection).
    """
    from torch.distributed.fsdp import fully_shard  # here: FSDP2 (with DTensor) is 1.6 s to import
    blocks = capabilities.blocks(model)
    units = list(blocks) if blocks is not None and len(blocks) else size_based_units(model, min_params_to_wrap)
    kwargs = dict(mesh=mesh, mp_policy=mp_policy, offload_policy=offload)
    for unit in units:
        fully_shard(unit, reshard_after_forward=reshard_after_forward, **kwargs)
    # The root's parameters (embeddings, output projection) are needed again as soon
    # as backward starts: resharding them after forward would only add an all-gather.
    fully_shard(model, reshard_after_forward=False, **kwargs)
    # Explicit prefetch: gather the next unit's parameters while this one computes.
    for i, unit in enumerate(units):
        if i + 1 < len(units):
            unit.set_modules_to_forward_prefetch([units[i + 1]])
        if i > 0:
            unit.set_modules_to_backward_prefetch([units[i - 1]])
    if uploads_ahead(offload, mesh):  # one rank gathers nothing, so the prefetch above overlaps no upload
        upload = UploadAhead(model, units, DeviceStreams(mesh.device_type))  # its hooks keep it alive
        attach_upload_timer(model, upload.upload_seconds)  # offload_upload: its copies, by their events
    return model


def return_transient_buffers_to_the_os(device: torch.device) -> None:
    """On the CPU, make glibc serve allocations above 4 MiB (MMAP_THRESHOLD) with mmap for good.

    FSDP allocates and frees large buffers every step (gathered blocks,
    unsharded gradients, reduce-scatter inputs). glibc raises its mmap
    threshold after such frees (up to 32 MB), so those buffers then come from
    the heap, which keeps and fragments them: a rank's resident memory grows
    to twice its live memory (benchmarks/memory.py). A fixed threshold returns
    them on free; 4 MiB rather than glibc's 128 KiB start, so small activations
    stay on the heap (128 KiB cost a third of the step time in overhead.py).
    CUDA memory is managed by PyTorch's caching allocator instead.
    """
    if device.type != "cpu":
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


_M_MMAP_THRESHOLD = -3  # from glibc's malloc.h
MMAP_THRESHOLD = 4 * 1024 * 1024
