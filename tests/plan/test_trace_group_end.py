"""shard-plan's trace ends its fake process group as a run ends its real one: with DTensor's sharding caches
emptied (core/torch_private.end_process_group), so that a run or a trace after it in the same process never meets
the trace's device meshes (tests/trainer/launch/test_group_end.py says why)."""
import torch.distributed as dist

from shardtrain.plan.trace import _traced
from shardtrain.trainer.resolved import Components, build_task
from st_testutils import make_space_data_bin, sharding_cache_clears, tiny_plan_cfg


def test_a_sharded_trace_empties_the_caches_when_its_group_ends(tmp_path, monkeypatch):
    cleared = sharding_cache_clears(monkeypatch)
    cfg = tiny_plan_cfg(make_space_data_bin(str(tmp_path), n_words=50), "--decoder-layers", "1",
                        "--ddp-backend", "fully_sharded")
    assert _traced(cfg, build_task(cfg, Components.of(cfg)), 2, 2)["activations"] > 0
    assert cleared == [False] and not dist.is_initialized()  # once, after the fake group had ended
