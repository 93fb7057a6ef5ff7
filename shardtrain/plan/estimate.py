"""From a traced step to one rank's memory on each device, bytes communicated and seconds per
update.

Memory is the pre-launch fit check's estimator (trainer/memory/rank_memory.py) fed the trace's peak by kind
(shardtrain.plan.trace) instead of a count: what the tracker cannot see (the backend's gradient copies, the
gradients --update-freq keeps, ZeRO's division of the optimizer state, --spike-rollback's snapshot, --async-save's
host copy) and where each kind lives are added there, from the run's classes, plus the kernels' own buffers
(RUNTIME_BYTES). This module prices the time of an update on top of it.

Time, with no overlap assumed (an upper bound where the backend overlaps communication with
compute), each piece priced on the device that runs it: the model's FLOPs at the matmul speed
(measured on this machine's device, or --peak-tflops; a third more forward under activation
checkpointing), the collectives' bytes at --network-gbps, the optimizer's passes over its state at
the memory bandwidth of the device it steps on (the GPU's, measured or --gpu-memory-gbps; the host's,
measured here, where it steps on the CPU), and the host<->GPU copies at --pcie-gbps.

One overlap is priced, as the run makes it: where the CPU optimizer steps each shard during backward
(trainer/parallel/step_in_backward.py), the step of the blocks' shards hides under the last micro-batch's
backward, up to that backward's length ("hidden", negative seconds). ``offload_split`` predicts the record
fields of trainer/offload_times.py from these, which shard-plan --verify compares with a run's.
"""
import dataclasses
from typing import Dict, Optional, Tuple

import torch

from shardtrain.trainer.parallel.choose import backend_class
from shardtrain.trainer.parallel.fsdp_wrap import reshards_after_forward
from shardtrain.trainer.run_facts import RunFacts, run_facts
from shardtrain.trainer.memory.rank_memory import RankMemory, rank_memory
from shardtrain.trainer.resolved import Components

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
# cpu_adam's fused CPU kernel (aten/src/ATen/native/cpu/FusedAdamKernel.cpp) also writes the gradient back when
# given a grad_scale, which cpu_adam always passes (the update's unscale x ranks / sample size is never 1):
# four fp32 tensors read, four written.
CPU_ADAM_STEP_BYTES = 8 * 4
# A GPU's memory bandwidth when planning for GPUs from a machine without one and no --gpu-memory-gbps:
# an H100 SXM's HBM3 (3.35 TB/s on its data sheet; an A100 80GB has 2.0, an H200 4.8).
GPU_MEMORY_GBPS = 3350.0


@dataclasses.dataclass
class Machine:
    """Where the plan runs. Speeds are per rank; memory is per GPU and per node's host."""
    device: str  # "cuda" or "cpu"
    world_size: int
    ranks_per_node: int
    gpu_bytes: Optional[int]
    host_bytes: int
    matmul_tflops: Dict[torch.dtype, float]
    copy_gbps: float  # host memory: what an optimizer stepping on the CPU reaches
    network_gbps: float
    pcie_gbps: float
    gpu_memory_gbps: float = GPU_MEMORY_GBPS  # what an optimizer stepping on the GPU reaches
    # Where each figure comes from, by name ("matmul", "copy", "gpu_memory", "network", "pcie", "gpu_bytes",
    # "host_bytes"): "measured here", or "given" (a flag), or "assumed" (a default); the printout says which.
    sources: Dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Estimate:
    """One rank of one configuration: its memory (the one estimator's, trainer/memory) and its time, built on it."""
    memory: RankMemory
    comm_bytes: int
    offload_bytes: int
    step_seconds: Dict[str, float]
    upload_seconds: float = 0.0  # of "offload", the parameters' copies before each forward (offload_upload)

    # The memory figures as the printout names them.
    params = property(lambda self: self.memory.params)
    grads = property(lambda self: self.memory.grads)
    optimizer = property(lambda self: self.memory.optimizer)
    master = property(lambda self: self.memory.master)
    activations = property(lambda self: self.memory.activations)
    fsdp_buffers = property(lambda self: self.memory.gathered)
    temporaries = property(lambda self: self.memory.temporaries)
    extra = property(lambda self: self.memory.extra)  # DDP buckets, legacy_ddp's flat buffer
    runtime = property(lambda self: self.memory.runtime)  # kernels' own buffers (RUNTIME_BYTES)
    snapshot = property(lambda self: self.memory.snapshot)  # --spike-rollback's copy (0 without it)
    staged = property(lambda self: self.memory.staged)  # --async-save's host copy of the state on the GPU

    @property
    def gpu_peak(self) -> Optional[int]:
        return None if self.memory.device_type == "cpu" else self.memory.placed()["device"]

    @property
    def host_peak(self) -> int:
        """This rank's; the node holds ranks_per_node of them."""
        return self.memory.placed()["host"]

    @property
    def seconds(self) -> float:
        return sum(self.step_seconds.values())

    def offload_split(self) -> Dict[str, float]:
        """The record fields of trainer/offload_times.py this estimate predicts: forward+backward (compute,
        collectives, host<->GPU copies), upload (the parameters' copies before each forward), the CPU step, its exposed
        part and the percent hidden under backward. Waiting for gradients is not priced (it is in the copies)."""
        s = self.step_seconds
        hidden = -s.get("hidden", 0.0)
        return {"offload_fwd_bwd": s["compute"] + s["communication"] + s["offload"],
                "offload_upload": self.upload_seconds, "offload_cpu_step": s["optimizer"],
                "offload_step_exposed": s["optimizer"] - hidden,
                "offload_hidden": 100.0 * hidden / s["optimizer"] if s["optimizer"] else 0.0}


def estimate(cfg, kinds: Dict[str, int], count: int, flops_per_token: float, tokens: int,
             machine: Machine, block_share: float = 1.0) -> Estimate:
    """``kinds``: the traced peak (traced_peak); ``count``: the model's parameters;
    ``flops_per_token``: its training FLOPs per token; ``tokens``: a micro-batch's; ``block_share``: the share
    of the parameters in FSDP's units below the root (planner.unit_share): those reshard after forward and are
    stepped during backward."""
    facts = run_facts(cfg, Components.of(cfg), machine.world_size, machine.ranks_per_node)  # an option's own
    memory = rank_memory(facts, count, kinds, machine.device,
                         runtime=RUNTIME_BYTES[(machine.device, facts.dtypes.compute is not None)])
    comm = _comm_bytes(cfg, count, facts, machine)
    offload, upload = _offload_bytes(cfg, count, facts, machine, block_share)
    return Estimate(
        memory=memory, comm_bytes=comm, offload_bytes=offload, upload_seconds=upload / (machine.pcie_gbps * 1e9),
        step_seconds=_seconds(cfg, facts, count, flops_per_token * tokens, machine, comm, offload,
                              block_share if steps_during_backward(cfg, facts, machine) else None))


def optimizer_steps_on_host(cfg) -> bool:
    """Whether a GPU run's optimizer steps on the CPU (its state in host memory): where the backend
    offloads the state, or an optimizer that steps in CPU memory (OptimizerSpec.steps_on_cpu)."""
    facts = run_facts(cfg, Components.of(cfg), 1, 1, backend=backend_class(cfg.distributed.ddp_backend))
    return facts.optimizer_on_host


def _comm_bytes(cfg, count: int, facts: RunFacts, machine: Machine) -> int:
    """Bytes one rank sends (and receives) in one update's collectives: the backend's, and ZeRO's
    broadcast of each rank's updated partition."""
    world = machine.world_size
    if world == 1:
        return 0
    total = facts.backend.bytes_communicated(cfg.distributed, world, count, facts.dtypes,
                                             facts.update_freq, facts.shards)
    if facts.zero_shards > 1:
        total += int((world - 1) / world * count * facts.param_bytes)
    return total


def _offload_bytes(cfg, count: int, facts: RunFacts, machine: Machine, unit_share: float) -> Tuple[int, int]:
    """Host<->GPU bytes per update, and of them the parameters' copies before each forward. An offloading
    backend, every micro-batch: its fp32 shards in before forward, the units that reshard after forward
    (``unit_share`` of the parameters; FSDP2's root never does) in again for backward, the gradients out: 3 x 4
    bytes a parameter, 2 x 4 where nothing reshards (fsdp_wrap.reshards_after_forward). An optimizer stepping in
    CPU memory: the gradients out and the parameters back, once an update."""
    if machine.device == "cpu":
        return 0, 0
    if facts.state_on_host:
        shard = 4 * count / facts.shards
        again = unit_share if reshards_after_forward(cfg.distributed) else 0.0
        return int(facts.update_freq * shard * (2 + again)), int(facts.update_freq * shard)
    if facts.spec.steps_on_cpu:
        return 2 * 4 * count, 4 * count
    return 0, 0


def step_bytes(cfg, facts: RunFacts, machine: Machine) -> int:
    """Bytes of memory the optimizer's step touches per parameter: cpu_adam's fused CPU kernel where it steps
    on the host with fp32 moments, else fused Adam's."""
    fused_on_host = getattr(facts.spec.cls, "steps_on_host", False) and facts.spec.state_bytes == 8
    return CPU_ADAM_STEP_BYTES if fused_on_host and optimizer_device(cfg, machine) == "cpu" else ADAM_STEP_BYTES


def steps_during_backward(cfg, facts: RunFacts, machine: Machine) -> bool:
    """Whether the run's optimizer steps each shard during backward: the run's own decision
    (``RunFacts.cpu_step_after_backward``, which the trainer's step is built from) on this machine's device."""
    return facts.cpu_step_after_backward(machine.device) is None


def _seconds(cfg, facts: RunFacts, count: int, micro_batch_flops: float, machine: Machine, comm: int,
             offload: int, block_share: Optional[float]) -> Dict[str, float]:
    """``block_share``: where the optimizer steps during backward, the share of its work that may (the blocks'
    shards: the root's step after backward); None where it steps after backward."""
    update_freq, dtypes, checkpointed = facts.update_freq, facts.dtypes, facts.checkpointed
    optimizer_shards = facts.shards * facts.zero_shards
    recompute = 4 / 3 if checkpointed else 1.0  # forward is 2 of 6
    flops = micro_batch_flops * update_freq * recompute
    seconds = {"compute": flops / (machine.matmul_tflops[dtypes.compute or torch.float32] * 1e12),
               "communication": comm / (machine.network_gbps * 1e9),
               "optimizer": step_bytes(cfg, facts, machine) * count / optimizer_shards
               / (optimizer_gbps(cfg, machine) * 1e9),
               "offload": offload / (machine.pcie_gbps * 1e9)}
    if block_share is not None:
        # The last micro-batch's backward: 4 of its 6 FLOPs per parameter and token, 6 of 8 with the forward
        # recomputed in it.
        backward = seconds["compute"] / update_freq * (3 / 4 if checkpointed else 2 / 3)
        seconds["hidden"] = -min(seconds["optimizer"] * block_share, backward)
    return seconds


def optimizer_device(cfg, machine: Machine) -> str:
    """Where the optimizer steps: on the host ("cpu") on a CPU run, with cpu_adam or under --cpu-offload;
    on the GPU otherwise."""
    return "cpu" if machine.device == "cpu" or optimizer_steps_on_host(cfg) else machine.device


def optimizer_gbps(cfg, machine: Machine) -> float:
    """The memory bandwidth the optimizer's passes run at: that of the device it steps on."""
    return machine.copy_gbps if optimizer_device(cfg, machine) == "cpu" else machine.gpu_memory_gbps
