"""Plan a run: calibrate this machine, trace each configuration's step, estimate, rank."""
import dataclasses
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch

from shardtrain.config.checks import check_config
from shardtrain.config.overridden import with_overrides
from shardtrain.core.errors import ConfigError
from shardtrain.models import capabilities
from shardtrain.plan.estimate import GPU_MEMORY_GBPS, Estimate, Machine, estimate
from shardtrain.plan.options import Option, alternatives, as_given, trace_key
from shardtrain.plan.trace import batch_shape, traced_peak
from shardtrain.trainer.memory.fit import host_available_bytes
from shardtrain.trainer.memory.layers import extrapolated, repeated_layers
from shardtrain.trainer.memory.model_sizes import block_share, model_sizes
from shardtrain.trainer.memory.pinned import pinned_rounding
from shardtrain.trainer.metrics.flops import measured_peak_tflops, model_flops_per_token
from shardtrain.trainer.parallel.fsdp_wrap import size_based_units
from shardtrain.trainer.resolved import Components, build_model, build_task
from shardtrain.trainer.run_facts import run_facts

GIB = 2 ** 30
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Collective bandwidth per rank when not given: gloo between processes of one machine; NCCL over
# NVLink within a node; across nodes, a 200 Gb/s InfiniBand link per GPU.
NETWORK_GBPS = {"cpu": 2.0, "cuda_node": 100.0, "cuda_nodes": 25.0}
PCIE_GBPS = 25.0  # PCIe 4.0 x16


@dataclasses.dataclass
class Planned:
    option: Option
    cfg: object
    estimate: Estimate
    fits: bool


@dataclasses.dataclass
class Plan:
    machine: Machine
    count: int
    flops_per_token: float
    shape: tuple  # (sequences, tokens each) of a micro-batch
    given: Planned
    options: List[Planned]
    headroom: float

    def recommended(self) -> Optional[Planned]:
        fitting = [p for p in self.options if p.fits]
        return min(fitting, key=lambda p: p.estimate.seconds) if fitting else None


def machine_for(cfg, gpu_memory: Optional[float], host_memory: Optional[float], gpus_per_node: Optional[int],
                nodes: Optional[int], network_gbps: Optional[float], pcie_gbps: Optional[float],
                gpu_memory_gbps: Optional[float] = None) -> Machine:
    """The machine the run will have: this one's GPU (or ``gpu_memory`` GiB), its available host memory
    (or ``host_memory`` GiB per node), speeds measured on this machine's devices (matmuls in each dtype,
    memory copies) or given, and the rest assumed; ``Machine.sources`` records which is which."""
    visible = torch.cuda.is_available() and not cfg.common.cpu
    device = "cuda" if visible or gpu_memory is not None else "cpu"
    per_node = gpus_per_node or (torch.cuda.device_count() if visible else None)
    world = cfg.distributed.distributed_world_size or ((nodes or 1) * per_node if per_node else 1)
    per_node = per_node or world
    sources = {"gpu_bytes": "given" if gpu_memory is not None else "measured here",
               "host_bytes": "given" if host_memory is not None else "measured here", "copy": "measured here",
               "matmul": "measured here" if device == "cpu" or visible else "given",
               "network": "given" if network_gbps else "assumed", "pcie": "given" if pcie_gbps else "assumed"}
    if device == "cuda" and gpu_memory is None:
        gpu_memory = torch.cuda.get_device_properties(0).total_memory / GIB
    threads = cfg.common.threads or max(1, (os.cpu_count() or 1) // per_node)
    gpu_speed, sources["gpu_memory"] = _gpu_memory_gbps(gpu_memory_gbps, device, visible)
    return Machine(
        device=device, world_size=world, ranks_per_node=min(per_node, world),
        gpu_bytes=int(gpu_memory * GIB) if gpu_memory is not None else None,
        host_bytes=int(host_memory * GIB) if host_memory is not None else host_available_bytes(),
        matmul_tflops=_matmul_speeds(cfg, device, visible, threads), copy_gbps=_copy_gbps(threads),
        network_gbps=network_gbps or NETWORK_GBPS["cpu" if device == "cpu" else
                                                  ("cuda_node" if world <= per_node else "cuda_nodes")],
        pcie_gbps=pcie_gbps or PCIE_GBPS, gpu_memory_gbps=gpu_speed, sources=sources)


def _matmul_speeds(cfg, device: str, visible: bool, threads: int) -> Dict[torch.dtype, float]:
    """TFLOP/s a rank reaches in each dtype: measured on this machine's device, or (planning for
    GPUs from a machine without one) --peak-tflops for bf16/fp16 and half of it for fp32 (TF32)."""
    if device == "cuda" and not visible:
        peak = cfg.common.peak_tflops
        if peak is None:
            raise ConfigError("shard-plan plans for GPUs (--gpu-memory) but sees none here to measure: pass "
                              "--peak-tflops with the GPU's bf16 TFLOP/s (e.g. 989 for an H100 SXM, 312 for an "
                              "A100), or run shard-plan on a GPU machine.")
        return {torch.float32: peak / 2, torch.bfloat16: peak, torch.float16: peak}
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        where = torch.device("cuda" if device == "cuda" else "cpu")
        return {dtype: measured_peak_tflops(where, dtype, seconds=0.1) for dtype in DTYPES}
    finally:
        torch.set_num_threads(saved)


def _copy_gbps(threads: int) -> float:
    """Host memory bandwidth one rank gets: the best of a few 64 MiB copies (read + write)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src, dst = torch.ones(16 * 2 ** 20), torch.empty(16 * 2 ** 20)
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - start)
        return 2 * src.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(saved)


def _gpu_memory_gbps(given: Optional[float], device: str, visible: bool) -> Tuple[float, str]:
    """The GPU's memory bandwidth, which a GPU optimizer's passes run at, and where it comes from:
    --gpu-memory-gbps; else measured on the visible GPU (the best of a few 1 GiB copies, read + write);
    else an H100's (GPU_MEMORY_GBPS)."""
    if given:
        return given, "given"
    if device != "cuda" or not visible:
        return GPU_MEMORY_GBPS, "assumed"
    src = torch.ones(2 ** 28, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best / 1e9, "measured here"


def plan(cfg, machine: Machine, headroom: float = 0.1, compare: bool = True, traces: Optional[Dict] = None,
         progress: Callable[[str], None] = lambda what: None) -> Plan:
    """Trace and estimate the configuration given and (``compare``) its alternatives. ``traces``:
    traced steps by trace_key, kept between calls for the same model and batch. ``progress`` is told
    each piece of work done (the model counted, each configuration traced): a large model's traces take
    minutes, which must not pass in silence."""
    components = Components.of(cfg)
    task = build_task(cfg, components)
    count = model_sizes(cfg, components, task)[0]
    blocks = unit_share(cfg, components, task)
    shape = batch_shape(cfg, task)
    flops_per_token = _flops_per_token(cfg, components, task, shape[1])
    progress(f"counted the model ({count:,} parameters)")
    traces = {} if traces is None else traces
    problem = refusal(cfg, machine)  # what shard-train would refuse on these ranks is no plan
    if problem:
        raise ConfigError(problem)

    def planned(option: Option, which: str) -> Planned:
        variant = option.apply(cfg)
        key = trace_key(variant)
        reused = key in traces
        if not reused:
            traces[key] = traced_peak(variant, task, machine.world_size, machine.ranks_per_node)
        kinds = dict(traces[key], pinned=_pinned(variant, components, task, machine))  # no trace sees it
        est = estimate(variant, kinds, count, flops_per_token, shape[0] * shape[1], machine, blocks)
        progress(f"planned {which}: {option.label}" + (" (an earlier trace reused)" if reused else " (traced)"))
        return Planned(option, variant, est, fits(est, machine, headroom))

    given = planned(as_given(), "the run")
    chosen = alternatives(cfg, machine.world_size, machine.ranks_per_node, machine.device) if compare else []
    chosen = [o for o in chosen if refusal(o.apply(cfg), machine) is None]  # shard-plan's own picks: skip misfits
    options = [planned(o, f"alternative {i} of {len(chosen)}") for i, o in enumerate(chosen, 1)]
    return Plan(machine, count, flops_per_token, shape, given, options, headroom)


def _pinned(cfg, components: Components, task, machine: Machine) -> int:
    """The pinned allocator's rounding of a rank's offloaded shards (trainer/memory/pinned.py)."""
    facts = run_facts(cfg, components, machine.world_size, machine.ranks_per_node)
    return pinned_rounding(cfg, components, task, facts, machine.device)


def refusal(cfg, machine: Machine) -> Optional[str]:
    """Why shard-train would refuse ``cfg`` on ``machine``'s ranks (the flag-check table, config/checks.py, with
    the world filled in, and a node's ranks as a hybrid strategy's group where --shard-group-size is not given, as
    fsdp_wrap.shard_group_size picks it), or None."""
    d = cfg.distributed
    filled = {"distributed.distributed_world_size": machine.world_size}
    if d.shard_group_size is None and d.fsdp_sharding_strategy.startswith("hybrid"):
        filled["distributed.shard_group_size"] = min(machine.ranks_per_node, machine.world_size)
    try:
        check_config(with_overrides(cfg, filled))
    except ConfigError as e:
        return str(e)
    return None


def unit_share(cfg, components: Components, task) -> float:
    """The share of the parameters in FSDP's units below the root (fsdp_wrap.apply_fsdp): they reshard after
    forward and are stepped during backward, where the root's gradients arrive at backward's end. A model with
    repeated layers: theirs (measured from one and two); one without: a meta build's blocks or size-based units
    (--min-params-to-wrap), none for a model smaller than that, whose every parameter is the root's."""
    if repeated_layers(cfg, components)[1]:
        return block_share(cfg, components, task)
    with torch.device("meta"):
        model = build_model(cfg, components, task)
    blocks = capabilities.blocks(model)
    units = list(blocks) if blocks is not None and len(blocks) else size_based_units(
        model, cfg.distributed.min_params_to_wrap)
    total = sum(p.numel() for p in model.parameters())
    return sum(p.numel() for unit in units for p in unit.parameters()) / total if total else 0.0


def _flops_per_token(cfg, components: Components, task, length: int) -> float:
    """The model's own count, from meta builds with one and two layers (extrapolated, as deep
    models take long to build even on meta)."""
    def count(variant) -> Dict[str, float]:
        with torch.device("meta"):
            return {"flops": model_flops_per_token(build_model(variant, components, task), length)}

    return extrapolated(cfg, components, count, whole_up_to=2)["flops"]


def fits(est: Estimate, machine: Machine, headroom: float) -> bool:
    """Within (1 - headroom) of the GPU's memory and of the node's host memory (shared by its ranks)."""
    usable = 1.0 - headroom
    if est.gpu_peak is not None and est.gpu_peak > usable * machine.gpu_bytes:
        return False
    return est.host_peak * machine.ranks_per_node <= usable * machine.host_bytes
