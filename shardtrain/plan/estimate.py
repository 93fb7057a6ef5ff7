"""From a traced step to one rank's memory on each device, bytes communicated and seconds per
update.

Memory: the trace's peak by kind (shardtrain.plan.trace), plus what the tracker cannot see:
DDP's gradient buckets (a copy of the gradients, unless --gradient-as-bucket-view), legacy_ddp's
flat all-reduce buffer, the gradients --update-freq keeps between micro-batches, and ZeRO's
division of the optimizer state. On a GPU run each kind is placed where the run keeps it: the
optimizer state (and cpu_adam's fp32 master copies) in host memory under cpu_adam or
--cpu-offload, the parameter and gradient shards too under --cpu-offload; the rest on the GPU.
--spike-rollback's snapshot (trainer/spike.py: a copy of the parameters, buffers and optimizer
state, held through every step) lies beside what it copies.

Time, with no overlap assumed (an upper bound where the backend overlaps communication with
compute): the model's FLOPs at this machine's measured matmul speed (a third more forward under
activation checkpointing), the collectives' bytes at --network-gbps, the optimizer's passes over
its state at the measured memory-copy speed, and --cpu-offload's copies at --pcie-gbps.
"""
import dataclasses
from typing import Dict, Optional

import torch

from shardtrain.plan.trace import FSDP_BACKENDS
from shardtrain.trainer.parallel.fsdp_wrap import reshards_after_forward
from shardtrain.trainer.precision import run_dtypes

MIB = 2 ** 20
# Memory a rank's kernels keep beyond tensors, which no trace of tensors sees. On the CPU, measured
# here (benchmarks/plan_accuracy.py: the resident peak above the traced live-tensor peak, which a
# tracker on the real run matched to 0.1 MiB): MKL's and the runtime's buffers, ~10-17 MiB; with
# bf16/fp16 compute also oneDNN's JIT kernels and primitive cache, ~4 MiB per matmul shape, 15-40 MiB
# in all. On a GPU: cuBLAS's workspace, which torch allocates through its caching allocator (32 MiB
# on Hopper). Not yet checked against a GPU run (tests/gpu/test_plan_gpu.py does, when one is lent).
RUNTIME_BYTES = {("cpu", False): 16 * MIB, ("cpu", True): 32 * MIB, ("cuda", False): 32 * MIB,
                 ("cuda", True): 32 * MIB}
# Bytes the optimizer reads and writes per parameter in one step (fused Adam: parameter, gradient
# and two moments read, parameter and moments written); others are counted as Adam.
ADAM_STEP_BYTES = 7 * 4


@dataclasses.dataclass
class Machine:
    """Where the plan runs. Speeds are per rank; memory is per GPU and per node's host."""
    device: str  # "cuda" or "cpu"
    world_size: int
    ranks_per_node: int
    gpu_bytes: Optional[int]
    host_bytes: int
    matmul_tflops: Dict[torch.dtype, float]
    copy_gbps: float
    network_gbps: float
    pcie_gbps: float


@dataclasses.dataclass
class Estimate:
    """One rank of one configuration."""
    params: int
    grads: int
    optimizer: int
    master: int
    activations: int
    fsdp_buffers: int
    temporaries: int
    extra: int  # DDP buckets, legacy_ddp's flat buffer
    runtime: int  # kernels' own buffers (RUNTIME_BYTES)
    snapshot: int  # --spike-rollback's copy of the parameters, buffers and optimizer state (0 without it)
    gpu_peak: Optional[int]
    host_peak: int  # this rank's; the node holds ranks_per_node of them
    comm_bytes: int
    offload_bytes: int
    step_seconds: Dict[str, float]

    @property
    def seconds(self) -> float:
        return sum(self.step_seconds.values())


def estimate(cfg, kinds: Dict[str, int], count: int, flops_per_token: float, tokens: int,
             machine: Machine) -> Estimate:
    """``kinds``: the traced peak (traced_peak); ``count``: the model's parameters;
    ``flops_per_token``: its training FLOPs per token; ``tokens``: a micro-batch's."""
    d, dtypes = cfg.distributed, run_dtypes(cfg)
    world = machine.world_size
    sharded = d.ddp_backend in FSDP_BACKENDS
    storage_bytes = dtypes.storage.itemsize if dtypes.storage is not None else 4
    shard = _shard_size(cfg, machine) if sharded else 1
    params = kinds["params"]
    grads = count * storage_bytes // shard
    master = count * 4 // shard if dtypes.storage is not None and kinds["optimizer"] >= count * 4 else 0
    optimizer = kinds["optimizer"] - master
    zero = not sharded and d.zero_sharding == "os" and world > 1
    if zero:
        optimizer, master = optimizer // world, master // world
    peak = sum(kinds.values()) - (kinds["optimizer"] - optimizer - master)
    extra = 0
    if cfg.optimization.update_freq[0] > 1:  # the first micro-batches' gradients stay through the last
        peak += max(0, grads - kinds["grads"])
    if world > 1 and d.ddp_backend in ("pytorch_ddp", "c10d") and not d.gradient_as_bucket_view:
        extra = grads  # the buckets: a second copy of every gradient
    elif world > 1 and d.ddp_backend in ("legacy_ddp", "no_c10d"):  # the flat copy, after backward
        extra = max(0, params + optimizer + master + kinds["buffers"] + 2 * grads - peak)
    runtime = RUNTIME_BYTES[(machine.device, dtypes.compute is not None)]
    snapshot = params + optimizer + master + kinds["buffers"] if cfg.optimization.spike_rollback else 0
    peak += extra + runtime + snapshot
    if machine.device == "cpu":
        gpu_peak, host = None, peak
    else:  # the snapshot's copies lie where the originals do (the buffers' on the GPU)
        host = _on_host(cfg, params, grads, optimizer, master) + (
            _on_host(cfg, params, 0, optimizer, master) if snapshot else 0)
        gpu_peak = peak - host
    comm, offload = _comm_bytes(cfg, count, dtypes, machine, shard), _offload_bytes(cfg, count, shard, machine)
    return Estimate(
        params=params, grads=grads, optimizer=optimizer, master=master, activations=kinds["activations"],
        fsdp_buffers=kinds["gathered_params"] + kinds["gathered_grads"] + kinds["comm_buffers"],
        temporaries=kinds["temporaries"], extra=extra, runtime=runtime, snapshot=snapshot, gpu_peak=gpu_peak,
        host_peak=host,
        comm_bytes=comm, offload_bytes=offload,
        step_seconds=_seconds(cfg, count, flops_per_token * tokens, dtypes, machine, comm, offload,
                              shard if sharded else (world if zero else 1)))


def _shard_size(cfg, machine: Machine) -> int:
    """Ranks a fully_sharded parameter is split over: all of them, or a hybrid group."""
    strategy = cfg.distributed.fsdp_sharding_strategy
    if strategy in ("full_shard", "shard_grad_op"):
        return machine.world_size
    if strategy == "no_shard":
        return 1
    return min(cfg.distributed.shard_group_size or machine.ranks_per_node, machine.world_size)


def _on_host(cfg, params: int, grads: int, optimizer: int, master: int) -> int:
    """What a GPU run keeps in host memory: the optimizer's state where the optimizer steps on the CPU,
    and the parameter and gradient shards under --cpu-offload."""
    d = cfg.distributed
    optimizer_on_cpu = d.cpu_offload or cfg.components.optimizer == "cpu_adam"
    return (optimizer + master if optimizer_on_cpu else 0) + (params + grads if d.cpu_offload else 0)


def _comm_bytes(cfg, count: int, dtypes, machine: Machine, shard: int) -> int:
    """Bytes one rank sends (and receives) in one update's collectives (ring algorithms)."""
    d, world = cfg.distributed, machine.world_size
    if world == 1:
        return 0
    micro = cfg.optimization.update_freq[0]
    compute = (dtypes.compute or torch.float32).itemsize
    reduce = compute if d.reduce_in_low_precision and dtypes.compute else 4
    if d.ddp_backend not in FSDP_BACKENDS:
        grad_bytes = (dtypes.storage or torch.float32).itemsize
        total = 2 * (world - 1) / world * count * grad_bytes
        if d.zero_sharding == "os":  # each rank broadcasts its updated partition
            total += (world - 1) / world * count * grad_bytes
        return int(total)
    gathers = 2 if reshards_after_forward(d) else 1  # forward, and again in backward after resharding
    per_micro = (shard - 1) / shard * count * (gathers * compute + reduce)
    replicas = world // shard
    across = 2 * (replicas - 1) / replicas * count / shard * reduce if replicas > 1 else 0
    return int(micro * per_micro + across)


def _offload_bytes(cfg, count: int, shard: int, machine: Machine) -> int:
    """Host<->GPU bytes per update: --cpu-offload's shards in and gradients out every micro-batch;
    cpu_adam's gradients out and parameters back."""
    if machine.device == "cpu":
        return 0
    micro = cfg.optimization.update_freq[0]
    if cfg.distributed.cpu_offload:
        return micro * 2 * 4 * count // shard
    if cfg.components.optimizer == "cpu_adam":
        return 2 * 4 * count
    return 0


def _seconds(cfg, count: int, micro_batch_flops: float, dtypes, machine: Machine, comm: int, offload: int,
             optimizer_shards: int) -> Dict[str, float]:
    d = cfg.distributed
    recompute = 4 / 3 if (d.checkpoint_activations or d.offload_activations) else 1.0  # forward is 2 of 6
    flops = micro_batch_flops * cfg.optimization.update_freq[0] * recompute
    return {"compute": flops / (machine.matmul_tflops[dtypes.compute or torch.float32] * 1e12),
            "communication": comm / (machine.network_gbps * 1e9),
            "optimizer": ADAM_STEP_BYTES * count / optimizer_shards / (machine.copy_gbps * 1e9),
            "offload": offload / (machine.pcie_gbps * 1e9)}
