"""shard-plan's decisions, without processes: what each backend adds to the traced step, where a
GPU run keeps each kind, the bytes each backend communicates, the trace itself, the recommendation."""
import pytest
import torch

from shardtrain.cli import plan as plan_cli
from shardtrain.plan import estimate as est_mod
from shardtrain.plan import options, planner
from shardtrain.plan.estimate import Machine, estimate
from shardtrain.plan.options import alternatives, flags_to_add
from shardtrain.plan.planner import plan
from shardtrain.plan.trace import _traced, traced_peak
from shardtrain.trainer.resolved import Components, build_task
from st_testutils import cli_refusal, make_space_data_bin, tiny_plan_cfg

MIB = 2 ** 20
COUNT = 1_000_000  # parameters
KINDS = {"params": 4 * COUNT, "gathered_params": 0, "grads": 0, "gathered_grads": 0, "optimizer": 8 * COUNT,
         "buffers": 0, "activations": 50 * MIB, "temporaries": 20 * MIB, "comm_buffers": 0}


def machine(world=2, device="cpu", per_node=None):
    return Machine(device=device, world_size=world, ranks_per_node=per_node or world, gpu_bytes=80 * 2 ** 30,
                   host_bytes=64 * 2 ** 30, matmul_tflops={torch.float32: 1.0, torch.bfloat16: 2.0,
                                                           torch.float16: 2.0},
                   copy_gbps=10.0, network_gbps=10.0, pcie_gbps=20.0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("plan")), n_words=50)


cfg_of = tiny_plan_cfg


def peak(data, *flags, world=2, kinds=KINDS, device="cpu"):
    e = estimate(cfg_of(data, *flags), dict(kinds), COUNT, 1000.0, 128, machine(world, device))
    return e, (e.host_peak if device == "cpu" else e.gpu_peak)


def test_ddp_buckets_are_a_second_copy_of_the_gradients(data):
    _, alone = peak(data, world=1)
    e, ddp = peak(data)
    assert ddp - alone == e.grads == 4 * COUNT
    assert peak(data, "--gradient-as-bucket-view")[1] == alone


def test_the_kernels_own_buffers_are_counted(data):
    """The plan is the traced tensors plus what no tracer sees: here the kernels' workspaces and code."""
    e, fp32 = peak(data, world=1)
    assert fp32 == sum(KINDS.values()) + est_mod.RUNTIME_BYTES[("cpu", False)] and e.runtime > 0
    assert peak(data, "--bf16", world=1)[1] == sum(KINDS.values()) + est_mod.RUNTIME_BYTES[("cpu", True)]


def test_zero_divides_the_optimizer_state_over_the_ranks(data):
    e, zero = peak(data, "--zero-sharding", "os", world=4)
    _, ddp = peak(data, world=4)
    assert e.optimizer == 2 * COUNT and ddp - zero == 6 * COUNT


def test_update_freq_keeps_the_first_micro_batches_gradients(data):
    assert peak(data, "--update-freq", "2", world=1)[1] - peak(data, world=1)[1] == 4 * COUNT


def test_legacy_ddp_flat_buffer_counts_when_it_is_the_peak(data):
    small = {**KINDS, "activations": 0, "temporaries": 0}
    e, legacy = peak(data, "--ddp-backend", "legacy_ddp", kinds=small)
    assert legacy == 4 * COUNT + 8 * COUNT + 2 * 4 * COUNT + e.runtime  # params, state, grads and their flat copy
    assert peak(data, "--ddp-backend", "legacy_ddp")[0].extra == 0  # under the activations' peak


def test_a_gpu_run_keeps_offloaded_shards_and_cpu_optimizer_state_on_the_host(data):
    on_gpu, gpu = peak(data, "--ddp-backend", "fully_sharded", device="cuda")
    offloaded, gpu_offloaded = peak(data, "--ddp-backend", "fully_sharded", "--cpu-offload", device="cuda")
    assert on_gpu.host_peak == 0
    assert offloaded.host_peak == offloaded.params + offloaded.grads + offloaded.optimizer
    # The traced peak holds no gradients yet (KINDS): offloading them frees the parameters' 4 MB and Adam's 8 MB
    # there, not the 2 MB of gradients the host holds once backward ends (they used to be taken off the GPU too).
    assert gpu - gpu_offloaded == 12 * COUNT
    cpu_adam, _ = peak(data, "--optimizer", "cpu_adam", device="cuda")
    assert cpu_adam.host_peak == cpu_adam.optimizer


def test_bytes_communicated_per_update(data):
    assert peak(data, world=4)[0].comm_bytes == int(2 * 3 / 4 * COUNT * 4)  # ring all-reduce of fp32 gradients
    fsdp = peak(data, "--ddp-backend", "fully_sharded", world=4)[0]
    assert fsdp.comm_bytes == int(3 / 4 * COUNT * (2 * 4 + 4))  # gather twice (forward, backward), reduce-scatter
    bf16 = peak(data, "--ddp-backend", "fully_sharded", "--bf16", world=4)[0]
    assert bf16.comm_bytes == int(3 / 4 * COUNT * (2 * 2 + 4))  # gathers in bf16, reductions in fp32
    m = machine(world=8, per_node=4)
    hybrid = estimate(cfg_of(data, "--ddp-backend", "fully_sharded", "--fsdp-sharding-strategy", "hybrid_shard"),
                      dict(KINDS), COUNT, 1000.0, 128, m)
    assert hybrid.comm_bytes == int(3 / 4 * COUNT * 12 + 2 * 1 / 2 * COUNT / 4 * 4)  # + all-reduce across 2 groups


def test_the_trace_shards_checkpoints_and_extrapolates(data):
    # Sharding and checkpointing on 2 layers (each traced whole, once); the extrapolation on 3 (traced with one
    # and two layers, and whole): 7 traces.
    cfg = cfg_of(data, "--decoder-layers", "2")
    task = build_task(cfg, Components.of(cfg))
    one = traced_peak(cfg_of(data, "--decoder-layers", "2", "--ddp-backend", "fully_sharded"), task, 1)
    two = traced_peak(cfg_of(data, "--decoder-layers", "2", "--ddp-backend", "fully_sharded"), task, 2)
    assert two["params"] == pytest.approx(one["params"] / 2, rel=0.02)  # halves, up to uneven rows
    assert two["optimizer"] == pytest.approx(one["optimizer"] / 2, rel=0.02)
    plain = traced_peak(cfg, task, 1)
    checkpointed = traced_peak(cfg_of(data, "--decoder-layers", "2", "--checkpoint-activations"), task, 1)
    assert checkpointed["activations"] < 0.6 * plain["activations"]
    deep = cfg_of(data, "--decoder-layers", "3")
    assert traced_peak(deep, task, 1) == _traced(deep, task, 1, 1)  # 3 layers: one and two, extrapolated, are exact


# Each precision, activation checkpointing and --fp16-adam-stats on each kind of trace (whole on one rank: DDP and
# ZeRO; sharded: fully_sharded), and every backend: 6 traces with the given run's, where the whole product of
# alternatives takes 24 (test_alternatives_cover_backends_offload_checkpointing_and_precision checks that list).
WEIGHED = ("pytorch_ddp, fp32", "pytorch_ddp, fp16, fp16 stats", "pytorch_ddp + zero os, bf16, checkpointed",
           "fully_sharded, fp16", "fully_sharded, fp32, checkpointed", "fully_sharded, bf16, checkpointed, fp16 stats")


def test_the_recommendation_is_the_fastest_that_fits(data, monkeypatch):
    monkeypatch.setattr(planner, "alternatives", lambda *args: [
        o for o in options.alternatives(*args) if o.label in WEIGHED])
    cfg = cfg_of(data, "--distributed-world-size", "2", "--cpu", "--decoder-layers", "1")  # traced whole, once
    m, traces = machine(), {}
    result = plan(cfg, m, traces=traces)
    assert sorted(p.option.label for p in result.options) == sorted(WEIGHED)  # none misspelt
    by_speed = sorted(result.options, key=lambda p: p.estimate.seconds)
    assert result.recommended() is by_speed[0]
    # Leave room for the smallest only: the recommendation is then that one, whatever its speed.
    smallest = min(result.options, key=lambda p: p.estimate.host_peak)
    m.host_bytes = int(smallest.estimate.host_peak * m.ranks_per_node / 0.9) + 1
    result = plan(cfg, m, traces=traces)
    assert result.recommended().option == smallest.option and not result.given.fits
    assert all(not p.fits for p in result.options if p.estimate.host_peak > smallest.estimate.host_peak)
    assert "--checkpoint-activations" in flags_to_add(cfg, smallest.option)


def test_alternatives_cover_backends_offload_checkpointing_and_precision(data):
    labels = [o.label for o in alternatives(cfg_of(data, "--optimizer", "cpu_adam"), 16, 8, "cuda")]
    for piece in ("pytorch_ddp, ", "zero os", "fully_sharded, ", "fully_sharded hybrid", "+ offload", "checkpointed",
                  "fp32", "bf16", "fp16", "fp16 stats"):
        assert any(piece in label for label in labels), piece
    assert not any("offload" in o.label for o in alternatives(cfg_of(data), 2, 2, "cpu"))  # saves nothing there


def test_shard_plan_prints_the_plan_and_a_recommendation(data, capsys, monkeypatch):
    # One alternative, whose label holds both pieces the printout must show: 2 traces (the given run's, on one
    # rank, and this one on 16 fake ranks in 2 nodes) where all 72 alternatives take 36.
    monkeypatch.setattr(planner, "alternatives", lambda *args: [
        o for o in options.alternatives(*args) if o.label == "fully_sharded hybrid + offload, bf16, checkpointed"])
    plan_cli.main([data, "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "32",
                   "--decoder-attention-heads", "2", "--decoder-ffn-embed-dim", "64", "--tokens-per-sample", "32",
                   "--distributed-world-size", "16", "--gpus-per-node", "8", "--gpu-memory", "80",
                   "--peak-tflops", "989", "--host-memory", "1000"])
    out = capsys.readouterr().out
    for line in ("peak on the GPU", "peak in host memory", "communicated per update", "fully_sharded hybrid",
                 "+ offload", "recommended:"):
        assert line in out, line


@pytest.mark.parametrize("flags,words", [
    (["--gpu-memory", "-1"], "--gpu-memory must be a positive number"),
    (["--headroom", "1.5"], "--headroom is the fraction"),
    (["--gpu-memory", "80"], "--peak-tflops"),  # a GPU plan on a machine without one: nothing to measure
])
def test_bad_input_is_refused_in_one_paragraph(data, capsys, flags, words):
    if torch.cuda.is_available() and words == "--peak-tflops":
        pytest.skip("a GPU is visible: its speed is measured")
    message = cli_refusal(plan_cli.main, [data, *flags], capsys)[1]
    assert words in message


def test_the_trace_keeps_the_second_updates_peak_as_a_second_trace_of_the_same_shapes(data):
    """The trace runs two updates and keeps the second's peak: the first also sets up what the second reuses. Its
    peak used to be kept too: the first fully_sharded trace of a shape in a process held ten times the parameters'
    bytes as optimizer state (the first optimizer step on FSDP2's shards), a later trace of the same shapes two
    (shard-plan traces each configuration once). Shapes no other test traces (200 wide, 808 in the feed-forward),
    with more parameters than activations."""
    cfg = cfg_of(data, "--ddp-backend", "fully_sharded", "--decoder-layers", "1", "--decoder-embed-dim", "200",
                 "--decoder-ffn-embed-dim", "808")
    task = build_task(cfg, Components.of(cfg))
    first, second = _traced(cfg, task, 2, 2), _traced(cfg, task, 2, 2)
    assert first == second
    # the parameters' shard a rank holds, and Adam's two moments twice that (the step counters a few bytes more)
    assert first["optimizer"] - 2 * first["params"] < 1024


GPUS = ["--gpu-memory", "80", "--peak-tflops", "100", "--host-memory", "100"]
HYBRID = ["--ddp-backend", "fully_sharded", "--fsdp-sharding-strategy", "hybrid_shard"]


@pytest.mark.flag_effect("--shard-group-size", "--fsdp-sharding-strategy")
@pytest.mark.parametrize("flags", [
    ["--shard-group-size", "0", "--nodes", "1", "--gpus-per-node", "4"],
    ["--shard-group-size", "8", "--nodes", "1", "--gpus-per-node", "4"],  # the world from shard-plan's own flags
    ["--shard-group-size", "8", "--distributed-world-size", "4", "--gpus-per-node", "4"],
])
def test_a_shard_group_shard_train_refuses_is_refused_before_any_trace(data, capsys, monkeypatch, flags):
    monkeypatch.setattr(planner, "traced_peak", lambda *args: pytest.fail("traced a run shard-train refuses"))
    message = cli_refusal(plan_cli.main, [data, *HYBRID, *flags, *GPUS], capsys)[1]
    assert "--shard-group-size" in message


def test_the_hybrid_alternatives_that_do_not_divide_the_world_are_skipped(data, capsys, monkeypatch):
    """World 5 on 2 nodes of 2 GPUs: a node's 2 ranks do not divide 5, so hybrid is no option (it failed the whole
    plan, naming a --shard-group-size 2 the user never gave); on 4 ranks it is one."""
    hybrid = [o for o in alternatives(cfg_of(data), 5, 2, "cuda") if "hybrid" in o.label]
    assert hybrid  # offered by the backend: world 5 spans nodes
    assert all(planner.refusal(o.apply(cfg_of(data)), machine(5, "cuda", per_node=2)) for o in hybrid)
    assert not any(planner.refusal(o.apply(cfg_of(data)), machine(4, "cuda", per_node=2)) for o in hybrid)
    monkeypatch.setattr(planner, "alternatives", lambda *args: [o for o in options.alternatives(*args)
                                                                 if "hybrid" in o.label])
    result = plan_cli.main([data, "--distributed-world-size", "5", "--gpus-per-node", "2", *GPUS])
    assert result.options == []
    capsys.readouterr()
