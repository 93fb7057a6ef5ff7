"""shard-plan on a GPU: each configuration's planned GPU peak against torch.cuda.max_memory_allocated
of 4 real updates (the CPU suite checks resident memory: tests/benchmark_scripts/test_plan_accuracy.py), and the
speeds the planner measures on this GPU against what such hardware can do.

Ranges, from data sheets: a device-to-device copy (read + write) reaches 60-95% of the memory's
bandwidth, which runs from ~300 GB/s (T4, L4) to 8,000 GB/s (B200), so 100-10,000 GB/s; an H100 or
H200 (2,000-4,800 GB/s) at least 1,000. A missed synchronize (the launch timed, not the copy) reads
over 100,000 GB/s; counting elements as bytes reads 4x low. A pinned host-to-GPU copy runs at 1-100
GB/s over PCIe (3.0 x16 ~12, 5.0 x16 ~55; GH200's NVLink-C2C up to 450). An 8192 bf16 matmul
reaches 25-100% of the data sheet's dense peak (flops.GPU_PEAK_TFLOPS)."""
import time

import pytest
import torch

from conftest import gpu_count, needs_gpus
from gpu_runs import data_bin
from shardtrain.config.run_config import parse_train_args
from shardtrain.plan.measure import measure_in_subprocess
from shardtrain.plan.planner import machine_for, plan
from shardtrain.trainer.metrics.flops import gpu_peak_tflops

MODEL = ["--arch", "transformer_lm", "--decoder-layers", "4", "--decoder-embed-dim", "512",
         "--decoder-ffn-embed-dim", "2048", "--decoder-attention-heads", "8", "--tokens-per-sample", "512",
         "--batch-size", "8"]
CONFIGS = [[], ["--bf16"], ["--bf16", "--checkpoint-activations"], ["--ddp-backend", "fully_sharded", "--bf16"],
           ["--ddp-backend", "fully_sharded", "--cpu-offload", "--optimizer", "cpu_adam"]]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return data_bin(tmp_path_factory.mktemp("plan-gpu"))


@needs_gpus(1)
@pytest.mark.parametrize("ranks", [1, 2])
def test_planned_gpu_peaks_match_the_allocator(data, tmp_path, ranks):
    if gpu_count() < ranks:
        pytest.skip(f"needs {ranks} GPUs")
    cfgs = [parse_train_args([data, *MODEL, *extra, "--distributed-world-size", str(ranks),
                              "--save-dir", str(tmp_path / "ck")]) for extra in CONFIGS]
    machines = [machine_for(cfg, None, None, None, None, None, None) for cfg in cfgs]
    check_measured_speeds(machines[0])
    planned = [plan(cfg, machine, compare=False).given.estimate for cfg, machine in zip(cfgs, machines)]
    rows = []
    for extra, est, measured in zip(CONFIGS, planned, measure_in_subprocess(cfgs)):
        worst = max(measured["peaks"])
        rows.append((" ".join(extra) or "fp32", est.gpu_peak, worst, (est.gpu_peak - worst) / worst))
    table = "\n".join(f"{name}: planned {p / 2 ** 20:.1f} MiB, allocated {m / 2 ** 20:.1f} MiB ({e:+.1%})"
                      for name, p, m, e in rows)
    print(table)
    assert all(abs(e) <= 0.15 for *_, e in rows), table


def host_to_gpu_gbps() -> float:
    """The best of a few 256 MiB pinned host-to-GPU copies."""
    src = torch.ones(2 ** 26, pin_memory=True)
    dst = torch.empty_like(src, device="cuda")
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return src.numel() * 4 / best / 1e9


def check_measured_speeds(machine) -> None:
    name = torch.cuda.get_device_name(0)
    gbps, h2d = machine.gpu_memory_gbps, host_to_gpu_gbps()
    bf16, peak = machine.matmul_tflops[torch.bfloat16], gpu_peak_tflops(name, torch.bfloat16, tf32=False)
    print(f"{name}: GPU memory copy {gbps:.0f} GB/s, host->GPU {h2d:.1f} GB/s (the plan assumes "
          f"{machine.pcie_gbps:g}), bf16 matmul {bf16:.0f} TFLOP/s of {peak} on the data sheet")
    assert machine.sources["gpu_memory"] == machine.sources["matmul"] == "measured here", machine.sources
    assert 100 <= gbps <= 10_000, f"{name}: the planner measured {gbps:.0f} GB/s of GPU memory bandwidth"
    if "H100" in name or "H200" in name:
        assert gbps >= 1000, f"{name}: {gbps:.0f} GB/s, under half an H100 PCIe's 2,000 GB/s"
    assert 1 <= h2d <= (500 if "GH200" in name else 100), f"{name}: host->GPU {h2d:.1f} GB/s"
    if peak is not None:
        assert 0.25 * peak <= bf16 <= 1.05 * peak, f"{name}: bf16 matmul {bf16:.0f} TFLOP/s, data sheet {peak}"
    assert 1 <= machine.copy_gbps <= 1000, f"host memory copy {machine.copy_gbps:.1f} GB/s"
