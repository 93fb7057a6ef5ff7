"""shard-plan on a GPU: each configuration's planned GPU peak against torch.cuda.max_memory_allocated
of 4 real updates (the CPU suite checks resident memory: tests/plan/test_plan_accuracy.py)."""
import pytest

from conftest import gpu_count, needs_gpus
from gpu_runs import data_bin
from shardtrain.config.run_config import parse_train_args
from shardtrain.plan.measure import measure_in_subprocess
from shardtrain.plan.planner import machine_for, plan

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
    planned = [plan(cfg, machine_for(cfg, None, None, None, None, None, None), compare=False).given.estimate
               for cfg in cfgs]
    rows = []
    for extra, est, measured in zip(CONFIGS, planned, measure_in_subprocess(cfgs)):
        worst = max(measured["peaks"])
        rows.append((" ".join(extra) or "fp32", est.gpu_peak, worst, (est.gpu_peak - worst) / worst))
    table = "\n".join(f"{name}: planned {p / 2 ** 20:.1f} MiB, allocated {m / 2 ** 20:.1f} MiB ({e:+.1%})"
                      for name, p, m, e in rows)
    print(table)
    assert all(abs(e) <= 0.15 for *_, e in rows), table
