"""shard-plan answers as fast for 16,384 ranks as for 8 (issue 29, red-team item 7): the FSDP trace runs on
at most TRACE_RANKS fake ranks, and one rank's share of a larger run is scaled from parameter shapes."""
import pytest
import torch

from shardtrain.core.errors import ConfigError
from shardtrain.plan import many_ranks, trace
from shardtrain.plan.many_ranks import TraceSizes, combine, trace_sizes
from shardtrain.trainer.resolved import Components, build_task
from st_testutils import make_space_data_bin, tiny_plan_cfg


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("plan_world")), n_words=50)


def fsdp_cfg(data, *flags):
    return tiny_plan_cfg(data, "--decoder-layers", "2", "--ddp-backend", "fully_sharded", *flags)


def test_the_trace_runs_on_as_many_fake_ranks_for_16384_as_for_1024(data, monkeypatch):
    """The cost that grew with the ranks was FSDP2's loop over them while tracing: count the fake ranks."""
    worlds = []
    real = trace.init_fake_process_group
    monkeypatch.setattr(trace, "init_fake_process_group", lambda world: (worlds.append(world), real(world)))
    cfg = fsdp_cfg(data)
    task = build_task(cfg, Components.of(cfg))
    for world in (8, 1024, 16384):
        trace._traced(cfg, task, world, world)
    assert worlds == [8, 32, 64, 32, 64]  # its own world up to 64; beyond, 32 and 64 whatever the world


def test_a_scaled_trace_holds_what_fsdp2_gives_one_rank(data, monkeypatch):
    """128 ranks traced on 4 and 8 (TRACE_RANKS 8) against the trace on 128: each rank's padded shard of
    every parameter (32-row weights pad to one row a rank) and its optimizer state are exact."""
    cfg = fsdp_cfg(data)
    task = build_task(cfg, Components.of(cfg))
    exact = trace._traced(cfg, task, 128, 128)
    monkeypatch.setattr(many_ranks, "TRACE_RANKS", 8)
    scaled = trace._traced(cfg, task, 128, 128)
    assert scaled["params"] == exact["params"] == 1600  # 400 elements a rank, written down from the shapes
    assert scaled["optimizer"] == exact["optimizer"]
    # the gathered wholes are scaled, not exact: the tracker's peak moment moves a little between traces
    assert scaled["gathered_params"] == pytest.approx(exact["gathered_params"], rel=0.05)


@pytest.mark.flag_effect("--fsdp-sharding-strategy", "--shard-group-size")
def test_the_worlds_traced_for_each_strategy(data):
    full = fsdp_cfg(data).distributed
    assert trace_sizes(full, 8, 8) == [TraceSizes(8, None, 8, 8)]
    assert trace_sizes(full, 16384, 16384) == [TraceSizes(32, 32, 32, 16384), TraceSizes(64, 64, 64, 16384)]
    hybrid = fsdp_cfg(data, "--fsdp-sharding-strategy", "hybrid_shard", "--shard-group-size", "8").distributed
    assert trace_sizes(hybrid, 16384, 16384) == [TraceSizes(64, 8, 8, 8)]  # only the replicas are many: exact
    with pytest.raises(ConfigError, match="does not divide the world size 16388"):
        trace_sizes(hybrid, 16388, 16388)


def test_combine_fits_the_shards_and_scales_the_wholes():
    rows = [(100, 10)]  # one 100 x 10 parameter: a rank holds ceil(100 / n) rows of 10
    small = {"params": 4 * 40, "grads": 0, "optimizer": 1000 + 8 * 40, "gathered_params": 4 * 32 * 40,
             "gathered_grads": 0, "comm_buffers": 0, "activations": 7, "temporaries": 9, "buffers": 3}
    large = {**small, "params": 4 * 20, "optimizer": 1000 + 8 * 20, "gathered_params": 4 * 64 * 20}
    out = combine([(TraceSizes(32, 32, 32, 16384), small), (TraceSizes(64, 64, 64, 16384), large)], rows)
    assert out["params"] == 4 * 10 and out["optimizer"] == 1000 + 8 * 10  # 1 row a rank; the steps stay
    assert out["gathered_params"] == 4 * 16384 * 10  # the padded whole: a row for each of 16384 ranks
    assert (out["activations"], out["temporaries"], out["buffers"]) == (7, 9, 3)
    assert combine([(TraceSizes(8, None, 8, 8), small)], rows) == small  # the run's own trace: as it is


def test_shard_grad_op_shards_over_every_rank_whatever_the_shard_group_size(data, monkeypatch):
    """Issue 37, item 2: --shard-group-size groups only the hybrid strategies (build_mesh's 2-D mesh);
    shard_grad_op shards over all ranks, like full_shard, and is traced so. 128 ranks traced on 4 and 8
    (TRACE_RANKS 8): each rank holds the same 400 elements (1,600 bytes) as under full_shard (written down
    from the shapes, test_a_scaled_trace_holds_what_fsdp2_gives_one_rank), not a group of 8's share."""
    grouped = fsdp_cfg(data, "--fsdp-sharding-strategy", "shard_grad_op", "--shard-group-size", "8")
    assert trace_sizes(grouped.distributed, 16, 16) == [TraceSizes(16, 8, 16, 16)]
    assert trace_sizes(grouped.distributed, 16384, 16384) == [TraceSizes(32, 32, 32, 16384), TraceSizes(64, 64, 64, 16384)]
    monkeypatch.setattr(many_ranks, "TRACE_RANKS", 8)
    task = build_task(grouped, Components.of(grouped))
    assert trace._traced(grouped, task, 128, 128)["params"] == 1600


def test_hybrid_shard_without_a_group_size_shards_within_a_node_in_the_trace_as_in_the_estimate(data):
    """Issue 40: without --shard-group-size a hybrid strategy shards within a node's ranks. The trace used to
    group all the fake ranks (they are no node's) while the estimate divided the gradients by a node's ranks:
    on 2 nodes of 2 ranks the plan held a quarter of the parameters a rank and half of their gradients."""
    hybrid = fsdp_cfg(data, "--fsdp-sharding-strategy", "hybrid_shard")
    assert trace_sizes(hybrid.distributed, 4, 2) == [TraceSizes(4, 2, 2, 2)]  # 2 nodes of 2 ranks
    assert trace_sizes(hybrid.distributed, 4, 4) == [TraceSizes(4, 4, 4, 4)]  # 1 node of 4
    task = build_task(hybrid, Components.of(hybrid))
    two_nodes = trace._traced(hybrid, task, 4, 2)
    full_over_two = trace._traced(fsdp_cfg(data), task, 2, 2)  # a rank's share of full_shard over 2 ranks
    assert two_nodes["params"] == full_over_two["params"] == 2 * trace._traced(fsdp_cfg(data), task, 4, 4)["params"]


def test_the_planner_traces_hybrid_shard_within_a_node(data, monkeypatch):
    """shard-plan for 2 nodes of 2 GPUs: its hybrid_shard estimate holds parameters and gradients over the same
    2 ranks (half each, as a full_shard over 2 would), not parameters over 4."""
    from shardtrain.plan import planner
    from shardtrain.plan.estimate import Machine
    monkeypatch.setattr(planner, "alternatives", lambda *args: [])
    cfg = fsdp_cfg(data, "--fsdp-sharding-strategy", "hybrid_shard")
    machine = Machine(device="cuda", world_size=4, ranks_per_node=2, gpu_bytes=80 * 2 ** 30, host_bytes=2 ** 40,
                      matmul_tflops={torch.float32: 100.0, torch.bfloat16: 200.0, torch.float16: 200.0},
                      copy_gbps=10.0, network_gbps=50.0, pcie_gbps=20.0)
    e = planner.plan(cfg, machine, compare=False).given.estimate
    assert e.grads == e.params  # fp32 parameters and gradients, both a half of the model a rank
