"""shard-plan plans a llama (issue 46, item 4) within 15% of measured runs: 8 blocks of a small llama, fully_sharded on
2 gloo ranks, one run where activations weigh most and one where the sharded state and FSDP's windows do.

Deep models are traced with a few blocks and extrapolated (trace.traced_peak). FSDP's windows (the gathered blocks,
the all-gather and reduce-scatter buffers, the unsharded gradients) fill only from the third block on (forward and
backward prefetch), so the line through one and two blocks that the trace drew before counted each window again
for every block: +10% on the first run here, +27% on the second, and 37 GiB a rank at llama3_1_8b on 8 ranks
(bf16, 1 x 2048 tokens) where the line through three and four gives 24."""
import os
import sys

import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.plan import planner
from shardtrain.plan.measure import measure_in_subprocess

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from make_data import random_data_bin  # noqa: E402

MIB = 2 ** 20
# GQA (8 query heads of 64 over 2 key/value heads), SwiGLU 2,048 wide, untied output; fp32 on the CPU. A block holds
# 3,802,112 parameters (q and o 512 x 512 each, k and v 512 x 128 each, three 512 x 2,048, two norms of 512): the
# state of 8 (parameters, gradients, Adam's two moments), sharded over 2 ranks, ~240 MiB a rank.
MODEL = ["--arch", "llama", "--decoder-layers", "8", "--decoder-embed-dim", "512", "--decoder-ffn-embed-dim", "2048",
         "--decoder-attention-heads", "8", "--decoder-kv-heads", "2", "--batch-size", "2", "--cpu", "--threads", "1",
         "--distributed-world-size", "2", "--ddp-backend", "fully_sharded"]
RUNS = {"activations": ["--tokens-per-sample", "128"], "state": ["--tokens-per-sample", "16"]}


@pytest.mark.slow
def test_a_llama_is_planned_within_fifteen_percent_of_its_measured_runs(tmp_path, monkeypatch):
    data = random_data_bin(str(tmp_path / "data"), vocab=1000, lines=40, line_len=300)
    cfgs = [parse_train_args([data, *MODEL, *extra, "--save-dir", str(tmp_path / "checkpoints")])
            for extra in RUNS.values()]
    monkeypatch.setattr(planner, "alternatives", lambda *args: [])  # the run as given only
    planned = [planner.plan(cfg, planner.machine_for(cfg, None, 100.0, None, None, None, None)).given.estimate
               for cfg in cfgs]
    measured = [max(run["peaks"]) for run in measure_in_subprocess(cfgs, updates=3)]
    errors = {name: (plan.host_peak - peak) / peak for name, plan, peak in zip(RUNS, planned, measured)}
    report = ", ".join(f"{name}: planned {plan.host_peak / MIB:.1f} MiB, measured {peak / MIB:.1f} ({errors[name]:+.1%})"
                       for name, plan, peak in zip(RUNS, planned, measured))
    print(report)
    assert min(measured) > 200 * MIB, report  # the model's state, not the runtime's noise
    assert all(abs(error) <= 0.15 for error in errors.values()), report
    # By hand: 8 blocks of 3,802,112, the embedding and the output projection 1,008 x 512 each (the data-bin's 1,004
    # words and fairseq's 4 specials), the final norm's 512; half on a rank, 4 bytes each.
    assert planned[0].params == planned[1].params == 4 * (8 * 3_802_112 + 2 * 1_008 * 512 + 512) // 2
    assert planned[0].activations > 4 * planned[1].activations  # the two runs weigh what they say
