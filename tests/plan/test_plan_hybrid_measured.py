"""shard-plan's "fully_sharded hybrid" alternative against a measured run (issue 40, item 3): without
--shard-group-size a hybrid strategy shards within a node's ranks. On 2 simulated nodes of 2 ranks (4 gloo
ranks on this CPU, run with --shard-group-size 2, the group a node of 2 gets by default) a rank holds
half of every parameter, gradient and optimizer state. A trace that shards over the world (the reading the issue
found) plans a quarter of the parameters and optimizer state a rank: 122.6 MiB against 168.1 measured here (-27%;
with the node's 2 ranks, 160.6 MiB: -4.5%). One spawn of 4 ranks, 3 updates, about 40 s."""
import os
import sys

import pytest

from shardtrain.config.overridden import with_overrides
from shardtrain.config.run_config import parse_train_args
from shardtrain.plan import planner
from shardtrain.plan.measure import measure_in_subprocess
from shardtrain.plan.options import alternatives

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from make_data import random_data_bin  # noqa: E402

MIB = 2 ** 20
# The state dominates: 2 blocks of 512 x 4096 (11.5M parameters in all, 176 MiB of fp32 parameters, gradients and
# Adam's two moments; 88 MiB a rank over 2), one block gathered at a time; short sequences keep activations and
# logits under a MiB, and a 1,000-word vocabulary keeps the root unit (embeddings, output) small. Two blocks are
# traced whole (deeper models are extrapolated from one and two: trace.traced_peak).
MODEL = ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "512",
         "--decoder-ffn-embed-dim", "4096", "--decoder-attention-heads", "8", "--tokens-per-sample", "32",
         "--batch-size", "2", "--cpu", "--threads", "1", "--distributed-world-size", "4"]


@pytest.mark.slow
def test_the_hybrid_alternative_within_fifteen_percent_of_a_run_on_two_nodes_of_two(tmp_path, monkeypatch):
    data = random_data_bin(str(tmp_path / "data"), vocab=1000, lines=40, line_len=200)
    cfg = parse_train_args([data, *MODEL, "--save-dir", str(tmp_path / "checkpoints")])
    machine = planner.machine_for(cfg, None, 100.0, 2, 2, None, None)  # shard-plan --gpus-per-node 2 --nodes 2
    assert (machine.world_size, machine.ranks_per_node) == (4, 2)
    hybrid = [o for o in alternatives(cfg, 4, 2, "cpu") if o.label == "fully_sharded hybrid, fp32"]
    assert len(hybrid) == 1 and dict(hybrid[0].overrides)["distributed.fsdp_sharding_strategy"] == "hybrid_shard"
    assert "--shard-group-size" not in MODEL
    monkeypatch.setattr(planner, "alternatives", lambda *args: hybrid)  # only the alternative measured is traced
    planned = planner.plan(cfg, machine).options[0]
    predicted = planned.estimate.host_peak
    # The run: 4 ranks spawned on this one host are one node's (the launch counts a node's ranks, issue 45: torchrun's
    # LOCAL_WORLD_SIZE is read only under torchrun), so a node of 2 is given as the group a 2-node run's default
    # picks; the plan above was made without it, from --gpus-per-node 2.
    node_group = with_overrides(planned.cfg, {"distributed.shard_group_size": 2})
    measured = max(measure_in_subprocess([node_group], updates=3)[0]["peaks"])
    error = (predicted - measured) / measured
    print(f"hybrid_shard on 2 nodes of 2: planned {predicted / MIB:.1f} MiB, measured {measured / MIB:.1f} MiB "
          f"({error:+.1%})")
    assert measured > 100 * MIB  # the model's state, not the runtime's noise
    assert abs(error) <= 0.15, f"planned {predicted / MIB:.1f} MiB, measured {measured / MIB:.1f} MiB ({error:+.1%})"
    # What a rank holds, by hand: 11,535,360 parameters (2 blocks of 5,251,584: attention 4 x (512 x 512 + 512),
    # feed-forward 512 x 4096 + 4096 + 4096 x 512 + 512, two layer norms 2 x 1,024; embeddings and output projection
    # 1,008 x 512 each, the dictionary padded to 8; the positions sinusoidal), half of each on a rank, 4 bytes a
    # value; Adam's two moments twice that, and the step counters' few bytes.
    assert planned.estimate.params == 4 * 11_535_360 // 2
    assert 8 * 11_535_360 // 2 <= planned.estimate.optimizer <= 8 * 11_535_360 // 2 + 1024
