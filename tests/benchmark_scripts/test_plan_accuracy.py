"""shard-plan is right: 8 configurations (1 and 2 ranks; pytorch_ddp, ZeRO, fully_sharded, legacy_ddp;
checkpointing, bf16, --update-freq, --cpu-offload with cpu_adam) planned, then trained for 3 updates (DDP
rebuilds its buckets in the second), each rank's measured peak within 15% of the prediction
(benchmarks/plan_accuracy.py: 10, larger)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import plan_accuracy  # noqa: E402
from make_data import random_data_bin  # noqa: E402
from plan_accuracy import CONFIGS, run_all  # noqa: E402

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

# Memory-heavy and compute-light, so the updates are quick: a 64k vocabulary over a narrow model and short
# batches (8.3M parameters: their state and the logits, ~0.35 GiB a rank, dwarf the runtime's own buffers).
MODEL = ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim",
         "256", "--decoder-attention-heads", "2", "--tokens-per-sample", "64", "--batch-size", "4"]
# Four in one process, four on 2 ranks (DDP's buckets alone, left out here, have an exact test in
# test_plan_decisions.py).
CHOSEN = [c for c in CONFIGS if c[0] not in ("2 ranks, pytorch_ddp", "2 ranks, fully_sharded")]


def test_eight_configurations_peak_within_fifteen_percent_of_the_plan(tmp_path, monkeypatch):
    assert len(CHOSEN) == 8
    data = random_data_bin(str(tmp_path / "data"), vocab=64000, lines=100, line_len=300)
    # The machine's speeds (matmuls in each dtype, memory copies), which no assertion here reads, are measured
    # once per world size rather than once per configuration.
    machines, machine_for = {}, plan_accuracy.machine_for

    def machine_once(cfg, *args):
        world = cfg.distributed.distributed_world_size
        if world not in machines:
            machines[world] = machine_for(cfg, *args)
        return machines[world]

    monkeypatch.setattr(plan_accuracy, "machine_for", machine_once)
    results = run_all(data, MODEL, CHOSEN, str(tmp_path / "checkpoints"), updates=3)
    table = "\n".join(f"{name}: predicted {r['predicted'] / 2 ** 20:.1f} MiB, measured {r['measured'] / 2 ** 20:.1f} "
                      f"MiB ({r['error']:+.1%})" for name, r in results)
    print(table)
    assert all(r["measured"] > 100 * 2 ** 20 for _, r in results), table  # the model's memory, not noise
    # Worst seen here: 5.8%. The kernels' own buffers (estimate.RUNTIME_BYTES) differ between CPUs (oneDNN's
    # JIT kernels for bf16), so the 15% is the bound; smaller terms have exact tests in
    # test_plan_decisions.py.
    assert all(abs(r["error"]) <= 0.15 for _, r in results), table
