"""Host memory torch's pinned allocator adds to --cpu-offload's shards on a GPU.

FSDP2's CPUOffloadPolicy(pin_memory=True) (parallel/fsdp_wrap.offload_policy: on CUDA only) pins each parameter's
padded shard, one allocation a tensor, and the reduced gradient's copy to the host is pinned too
(``.to("cpu", non_blocking=True)`` allocates pinned memory) where nothing reads it during backward: no hook
(the CPU step during backward registers one, and FSDP2 then copies into pageable memory,
torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). torch's CachingHostAllocator
(ATen/core/CachingHostAllocator.h, ``allocate``) rounds every block up to the next power of two (``PowerOf2Ceil``,
while the size is at most PYTORCH_CUDA_ALLOC_CONF's pinned_max_round_threshold: no limit by default) and keeps
freed blocks for the next allocation of that size, so the rounding stays for the whole run. A 1,000,000-byte shard
holds a 1,048,576-byte block.
"""
from typing import Sequence

import torch

from shardtrain.trainer.memory.layers import layer_split
from shardtrain.trainer.resolved import Components
from shardtrain.trainer.run_facts import RunFacts


def pinned_block(nbytes: int) -> int:
    """The bytes torch's pinned allocator holds for an ``nbytes`` allocation: the next power of two."""
    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()


def shard_bytes(shape: Sequence[int], shards: int, itemsize: int) -> int:
    """Bytes of one rank's padded FSDP2 shard of a parameter of ``shape`` (dim 0 split over ``shards`` ranks, each
    chunk as long as the first: torch.chunk's)."""
    rows = -(-shape[0] // shards) if shape else 1
    rest = 1
    for size in shape[1:]:
        rest *= size
    return rows * rest * itemsize


def pinned_copies(facts: RunFacts, device_type: str) -> int:
    """How many pinned blocks each parameter holds on a ``device_type`` run: its shard and its gradient's under
    --cpu-offload on a GPU, the shard alone where the optimizer steps during backward; none elsewhere."""
    if device_type != "cuda" or not facts.state_on_host:
        return 0
    return 1 if facts.steps_during_backward(device_type) else 2


def pinned_rounding(cfg, components: Components, task, facts: RunFacts, device_type: str) -> int:
    """The bytes the pinned blocks of one rank hold beyond its shards' (``pinned_copies`` of each), counted from
    the model ``cfg`` describes built on the meta device (deep models from one and two layers)."""
    copies = pinned_copies(facts, device_type)
    if not copies:
        return 0

    def measure(variant):
        with torch.random.fork_rng(devices=[]), torch.device("meta"):  # the RNG as it was, for the run
            model = task.build_model(components.model, variant.model)
        sizes = (shard_bytes(p.shape, facts.shards, facts.param_bytes) for p in model.parameters())
        return {"slack": sum(pinned_block(size) - size for size in sizes)}

    rest, per_layer, layers = layer_split(cfg, components, measure)
    return copies * (rest["slack"] + layers * per_layer["slack"])
