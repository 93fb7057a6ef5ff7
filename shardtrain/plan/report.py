"""shard-plan's printout: the run as given in detail, every alternative in one table, a recommendation."""
from typing import List, Optional

from shardtrain.plan.estimate import Estimate, Machine, optimizer_device, optimizer_gbps
from shardtrain.plan.options import flags_to_add
from shardtrain.plan.planner import Plan, Planned
from shardtrain.trainer.parallel.activation_checkpointing import checkpoint_every
from shardtrain.trainer.precision.choose import chosen

GIB = 2 ** 30
# What every memory figure is: the plan predicts what the run adds, as measure.py measures it.
BASELINE = ("memory is above each process's baseline, what it holds before the model is built: torch itself, the "
            "data, the CUDA context and the allocator's cache are not counted")


def _gib(n: Optional[int]) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def render(plan: Plan, base_cfg) -> str:
    m = plan.machine
    lines = [
        f"model: {plan.count:,} parameters, {plan.flops_per_token / 1e9:.3f} GFLOP per trained token; micro-batch "
        f"{plan.shape[0]} x {plan.shape[1]} tokens",
        *_machine(m),
        "",
        f"as given, per rank; {BASELINE}:",
        *_detail(plan.given.estimate, plan, m.device),
        "",
        f"alternatives (memory above the baseline, as above; fits: peak within {100 * (1 - plan.headroom):.0f}% of "
        + ("the GPU's memory and " if m.device == "cuda" else "") + "the node's host memory; seconds per update "
        "= compute + communication + optimizer + offload, no overlap):",
        *_table(plan.options, m.device, m.ranks_per_node),
        "",
        *_recommendation(plan, base_cfg),
    ]
    return "\n".join(lines)


def _machine(m: Machine) -> List[str]:
    """The machine, and each figure's source: measured here, given by a flag, or assumed."""
    def said(key: str) -> str:
        return f"({m.sources.get(key, 'given')})"

    tflops = {str(k).replace("torch.", ""): v for k, v in m.matmul_tflops.items()}
    if m.sources.get("matmul") == "given":  # planned from a machine without the GPU: --peak-tflops
        matmul = (f"bf16/fp16 {tflops['bfloat16']:.4g} TFLOP/s (given: --peak-tflops), fp32 "
                  f"{tflops['float32']:.4g} (assumed: half of it, TF32)")
    else:
        matmul = ", ".join(f"{k} {v:.3g}" for k, v in tflops.items()) + f" TFLOP/s {said('matmul')}"
    speeds = [f"matmul {matmul}"]
    if m.device == "cuda":
        speeds.append(f"GPU memory {m.gpu_memory_gbps:.4g} GB/s {said('gpu_memory')}")
    speeds += [f"host memory copies {m.copy_gbps:.3g} GB/s {said('copy')}",
               f"collectives {m.network_gbps:g} GB/s {said('network')}"]
    if m.device == "cuda":
        speeds.append(f"host<->GPU {m.pcie_gbps:g} GB/s {said('pcie')}")
    return [f"machine: {m.world_size} rank(s), {m.ranks_per_node} per node, on {m.device}; "
            + (f"GPU memory {_gib(m.gpu_bytes)} GiB {said('gpu_bytes')}, " if m.gpu_bytes else "")
            + f"host memory {_gib(m.host_bytes)} GiB per node {said('host_bytes')}",
            "speeds per rank: " + "; ".join(speeds)]


def _detail(e: Estimate, plan: Plan, device: str) -> List[str]:
    twin = _checkpointing_twin(plan)
    rows = [("parameters", e.params), ("gradients", e.grads), ("optimizer state", e.optimizer),
            ("master copies (fp32)", e.master),
            ("activations, peak of a micro-batch", e.activations),
            ("  the same with --checkpoint-activations" if not _checkpointed(plan.given.cfg)
             else "  the same without checkpointing", twin),
            ("FSDP gathered parameters/gradients, buffers", e.fsdp_buffers),
            ("temporaries at the peak (logits, their gradient...)", e.temporaries),
            ("DDP buckets / flat all-reduce buffer", e.extra),
            ("kernels' own buffers (workspaces, JIT code)", e.runtime)]
    if e.snapshot:
        rows.append(("--spike-rollback's snapshot of the state", e.snapshot))
    if e.staged:
        rows.append(("--async-save's pinned host copy of the state", e.staged))
    if e.memory.undo:
        rows.append(("the CPU step during backward's copies (host)", e.memory.undo))
    if e.memory.pinned:
        rows.append(("pinned blocks' rounding to powers of two (host)", e.memory.pinned))
    out = [f"  {name:<52} {_gib(value):>9} GiB" for name, value in rows]
    if device == "cuda":
        out.append(f"  {'peak on the GPU':<52} {_gib(e.gpu_peak):>9} GiB")
    out.append(f"  {'peak in host memory (this rank)':<52} {_gib(e.host_peak):>9} GiB")
    out.append(f"  {'communicated per update':<52} {e.comm_bytes / GIB:>9.3f} GiB"
               + (f" (+ {e.offload_bytes / GIB:.3f} GiB host<->GPU)" if e.offload_bytes else ""))
    parts = ", ".join(f"{k} {v:.3f}" for k, v in e.step_seconds.items() if v)
    out.append(f"  {'estimated seconds per update':<52} {e.seconds:>9.3f}    ({parts})")
    cfg, m = plan.given.cfg, plan.machine
    where = "the host (CPU)" if optimizer_device(cfg, m) == "cpu" else "the GPU"
    out.append(f"    the optimizer steps on {where}, at {optimizer_gbps(cfg, m):.4g} GB/s of memory bandwidth")
    if "hidden" in e.step_seconds:
        split = e.offload_split()
        out.append(f"    it steps each shard during backward: {-e.step_seconds['hidden']:.3f} s of its "
                   f"{split['offload_cpu_step']:.3f} s hide under the last backward "
                   f"({split['offload_hidden']:.0f}%; --cpu-step after-backward would add them)")
    return out


def _checkpointed(cfg) -> bool:
    return checkpoint_every(cfg.distributed) is not None


def _checkpointing_twin(plan: Plan) -> Optional[int]:
    """Activations of the alternative that differs from the given run only in checkpointing."""
    given = plan.given.cfg
    for p in plan.options:
        c = p.cfg
        if _checkpointed(c) != _checkpointed(given) and all(
                c.distributed[k] == given.distributed[k] for k in ("ddp_backend", "zero_sharding", "cpu_offload",
                                                                 "fsdp_sharding_strategy")) and \
                chosen(c.common) is chosen(given.common):
            return p.estimate.activations
    return None


def _table(options: List[Planned], device: str, ranks_per_node: int) -> List[str]:
    head = f"  {'configuration':<50} " + ("GPU GiB  " if device == "cuda" else "") + \
        "host GiB/node  comm GiB  compute s  comm s  optim s  offload s  s/update  fits"
    rows = [head]
    for p in sorted(options, key=lambda p: p.estimate.seconds):
        e, s = p.estimate, p.estimate.step_seconds
        gpu = f"{_gib(e.gpu_peak):>7}  " if device == "cuda" else ""
        rows.append(f"  {p.option.label:<50} {gpu}{e.host_peak * ranks_per_node / GIB:>13.2f}  "
                    f"{e.comm_bytes / GIB:>8.3f}  {s['compute']:>9.3f}  {s['communication']:>6.3f}  "
                    f"{s['optimizer']:>7.3f}  {s['offload']:>9.3f}  {e.seconds:>8.3f}  {'yes' if p.fits else 'NO'}")
    return rows


def _recommendation(plan: Plan, base_cfg) -> List[str]:
    best = plan.recommended()
    if best is None:
        return ["No configuration fits: more ranks (--distributed-world-size, nodes) to shard over, a smaller "
                "micro-batch (--batch-size / --max-tokens, with --update-freq to keep the batch), or a smaller model."]
    flags = flags_to_add(base_cfg, best.option)
    speed = plan.given.estimate.seconds / best.estimate.seconds
    verdict = "fits" if plan.given.fits else "does NOT fit"
    return [f"as given: {verdict}, about {plan.given.estimate.seconds:.3f} s per update.",
            f"recommended: {best.option.label} (about {best.estimate.seconds:.3f} s per update, {speed:.2f}x the "
            f"given speed): " + (" ".join(flags) if flags else "the command as given")]
