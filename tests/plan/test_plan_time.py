"""shard-plan's time model: each piece priced on the device that runs it (expected values worked out by
hand below), and the printout says which speeds were measured here, given by a flag or assumed, and what
its memory figures are."""
import pytest
import torch

from shardtrain.cli import plan as plan_cli
from shardtrain.plan import options, planner
from shardtrain.plan.estimate import Machine, estimate
from st_testutils import make_space_data_bin, tiny_plan_cfg

BILLION = 10 ** 9
# The memory a trace would report does not enter the time: any kinds will do.
KINDS = {"params": 4 * BILLION, "gathered_params": 0, "grads": 0, "gathered_grads": 0, "optimizer": 8 * BILLION,
         "buffers": 0, "activations": 0, "temporaries": 0, "comm_buffers": 0}
# docs/planning.md's example: 16 GPUs of 80 GiB, 8 a node, planned from this CPU.
README_GPUS = ["--distributed-world-size", "16", "--gpus-per-node", "8", "--gpu-memory", "80", "--peak-tflops", "989"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("plan_time")), n_words=50)


def seconds(data, *flags, world=1, device="cuda"):
    """The step's parts for a 1e9-parameter model; the GPU's memory moves 2,000 GB/s, the host's 10."""
    m = Machine(device=device, world_size=world, ranks_per_node=world, gpu_bytes=80 * 2 ** 30, host_bytes=2 ** 40,
                matmul_tflops={torch.float32: 100.0, torch.bfloat16: 200.0, torch.float16: 200.0}, copy_gbps=10.0,
                network_gbps=50.0, pcie_gbps=20.0, gpu_memory_gbps=2000.0)
    return estimate(tiny_plan_cfg(data, *flags), dict(KINDS), BILLION, 1000.0, 128, m).step_seconds


def test_a_gpu_optimizer_runs_at_the_gpus_memory_bandwidth(data):
    # Adam reads parameter, gradient and two moments and writes three: 28 bytes a parameter, on the GPU.
    assert seconds(data)["optimizer"] == pytest.approx(28 * 1e9 / 2000e9)  # 0.014 s
    # fully_sharded on 4 ranks: each steps its quarter.
    assert seconds(data, "--ddp-backend", "fully_sharded", world=4)["optimizer"] == pytest.approx(28 * 1e9 / 4 / 2000e9)


def test_an_optimizer_on_the_cpu_runs_at_the_hosts_copy_speed(data):
    # cpu_adam's fused CPU kernel reads parameter, gradient and two moments and writes all four (the gradient
    # divided by the grad_scale it is given): 32 bytes a parameter, 3.2 s on the host.
    cpu_adam = seconds(data, "--optimizer", "cpu_adam")
    assert cpu_adam["optimizer"] == pytest.approx(32 * 1e9 / 10e9)
    assert cpu_adam["offload"] == pytest.approx(2 * 4 * 1e9 / 20e9)  # gradients out, parameters back over PCIe
    offloaded = seconds(data, "--ddp-backend", "fully_sharded", "--cpu-offload", world=2)
    assert offloaded["optimizer"] == pytest.approx(28 * 1e9 / 2 / 10e9)  # torch's Adam, its half on the host: 1.4 s
    # its shards in for forward, in again for backward (the blocks reshard after forward), gradients out
    assert offloaded["offload"] == pytest.approx(3 * 4 * 1e9 / 2 / 20e9)
    assert seconds(data, device="cpu")["optimizer"] == pytest.approx(28 * 1e9 / 10e9)  # a CPU run: the host's


def test_collectives_run_at_the_network_speed_and_matmuls_at_the_devices(data):
    s = seconds(data, world=4)
    assert s["communication"] == pytest.approx(2 * 3 / 4 * 1e9 * 4 / 50e9)  # ring all-reduce of fp32 gradients
    assert s["compute"] == pytest.approx(1000.0 * 128 / 100e12)  # 128 tokens of 1,000 FLOPs at 100 TFLOP/s


def _plan(data, *flags, capsys, monkeypatch, keep=lambda label: False):
    """shard-plan on a tiny model, weighing only the alternatives ``keep`` picks (each costs a trace)."""
    monkeypatch.setattr(planner, "alternatives", lambda *args: [
        o for o in options.alternatives(*args) if keep(o.label)])
    result = plan_cli.main([data, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "32",
                            "--decoder-attention-heads", "2", "--decoder-ffn-embed-dim", "64", "--tokens-per-sample",
                            "32", *README_GPUS, "--host-memory", "1000", *flags])
    return result, capsys.readouterr().out


@pytest.mark.flag_effect("--gpu-memory-gbps")
def test_gpu_memory_gbps_prices_the_gpu_optimizer_and_says_it_was_given(data, capsys, monkeypatch):
    result, out = _plan(data, "--gpu-memory-gbps", "1000", capsys=capsys, monkeypatch=monkeypatch)
    assert result.machine.gpu_memory_gbps == 1000.0
    # pytorch_ddp: every rank steps the whole model, 28 bytes a parameter at 1,000 GB/s.
    assert result.given.estimate.step_seconds["optimizer"] == pytest.approx(28 * result.count / 1000e9)
    assert "GPU memory 1000 GB/s (given)" in out
    assert "the optimizer steps on" in out and "the GPU, at 1000 GB/s" in out


def test_the_printout_says_what_was_measured_given_or_assumed(data, capsys, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: its speeds are measured, not assumed")
    result, out = _plan(data, capsys=capsys, monkeypatch=monkeypatch, keep=lambda label: label == "fully_sharded, bf16")
    assert result.machine.gpu_memory_gbps == 3350.0  # an H100 SXM's, when no GPU is here to measure
    for words in ("GPU memory 3350 GB/s (assumed)", "bf16/fp16 989 TFLOP/s (given: --peak-tflops)",
                  "fp32 494.5 (assumed: half of it, TF32)", "collectives 25 GB/s (assumed)",
                  "host<->GPU 25 GB/s (assumed)", "GB/s (measured here)", "GPU memory 80.00 GiB (given)",
                  "host memory 1000.00 GiB per node (given)",
                  "memory is above each process's baseline, what it holds before the model is built"):
        assert words in out, words
    assert "compute s  comm s  optim s  offload s  s/update" in out  # the table shows why one option is faster


def test_readme_example_spends_under_five_percent_of_the_step_in_the_optimizer(data, capsys, monkeypatch):
    """README's command with 2 of its 24 blocks (a quick trace): both the parameters and the FLOPs scale with
    the blocks, so the optimizer's share is the example's. 28 bytes a parameter at 3,350 GB/s beside 6 FLOPs a
    parameter and token, 8,192 tokens, at 494.5 TFLOP/s (fp32): 0.2% of the compute alone. The alternatives:
    every backend in bf16 (the precision and checkpointing do not change the optimizer's pricing)."""
    monkeypatch.setattr(planner, "alternatives", lambda *args: [
        o for o in options.alternatives(*args) if o.label.endswith(", bf16")])
    result = plan_cli.main([data, "--arch", "transformer_lm_gpt3_xl", "--decoder-layers", "2",
                            "--tokens-per-sample", "2048", "--batch-size", "4", *README_GPUS, "--host-memory", "1000",
                            "--gpu-memory-gbps", "3350"])
    capsys.readouterr()
    given = result.given.estimate
    assert given.step_seconds["optimizer"] < 0.05 * given.seconds, given.step_seconds
    for p in result.options:  # each steps 28 bytes a parameter of its shard, on the device that runs it
        label = p.option.label  # ZeRO and fully_sharded: 1/16 a rank; hybrid shards within a node of 8
        share = 1 if label.startswith("pytorch_ddp,") else 8 if "hybrid" in label else 16
        speed = result.machine.copy_gbps if "offload" in label else 3350.0
        assert p.estimate.step_seconds["optimizer"] == pytest.approx(28 * result.count / share / speed / 1e9), label
        if "offload" not in label:
            assert p.estimate.step_seconds["optimizer"] < 0.05 * p.estimate.seconds, label


# Issue 37, item 2: the time model beyond the simplest setup, each at a non-default setting, worked out by hand.

def test_offload_copies_run_every_micro_batch(data):
    """--cpu-offload moves each micro-batch's fp32 shards in for forward, in again for backward (resharded after
    forward) and the gradients out: --update-freq 3 on 2 ranks copies 3 x (4 + 4 + 4) bytes x 1e9 / 2 = 18 GB at
    20 GB/s, three times one micro-batch's 6 GB."""
    offloaded = ("--ddp-backend", "fully_sharded", "--cpu-offload")
    assert seconds(data, *offloaded, world=2)["offload"] == pytest.approx(6e9 / 20e9)
    assert seconds(data, *offloaded, "--update-freq", "3", world=2)["offload"] == pytest.approx(18e9 / 20e9)  # 0.9 s


@pytest.mark.flag_effect("--no-reshard-after-forward", "--fsdp-sharding-strategy")
@pytest.mark.parametrize("kept", [["--no-reshard-after-forward"], ["--fsdp-sharding-strategy", "shard_grad_op"]])
def test_offload_copies_the_shards_in_once_where_nothing_reshards_after_forward(data, kept):
    """Nothing freed after forward: backward finds the parameters on the GPU, so (4 + 4) bytes x 1e9 / 2 = 4 GB."""
    offloaded = ("--ddp-backend", "fully_sharded", "--cpu-offload", *kept)
    assert seconds(data, *offloaded, world=2)["offload"] == pytest.approx(4e9 / 20e9)


def test_zero_broadcasts_each_ranks_updated_partition(data):
    """--zero-sharding os: after its step each rank broadcasts its updated partition, so a rank receives the
    others' (world - 1) / world of the fp32 parameters beside DDP's ring all-reduce of the gradients."""
    allreduce4 = 2 * 3 / 4 * 4e9  # 6 GB
    assert seconds(data, world=4)["communication"] == pytest.approx(allreduce4 / 50e9)
    zero4 = seconds(data, "--zero-sharding", "os", world=4)["communication"]
    assert zero4 == pytest.approx((allreduce4 + 3 / 4 * 4e9) / 50e9)  # + 3 GB: 0.18 s in all
    zero8 = seconds(data, "--zero-sharding", "os", world=8)["communication"]
    assert zero8 == pytest.approx((2 * 7 / 8 * 4e9 + 7 / 8 * 4e9) / 50e9)  # 7 + 3.5 GB


def test_offloaded_activations_are_recomputed_as_checkpointed_ones(data):
    """--offload-activations checkpoints each block (its input kept in host memory): backward runs the forward
    again, 2 of the step's 6 FLOPs a parameter and token, so 8 / 6 of 128 tokens x 1,000 FLOPs at 100 TFLOP/s."""
    plain = 1000.0 * 128 / 100e12
    assert seconds(data, "--offload-activations")["compute"] == pytest.approx(plain * 8 / 6)
    assert seconds(data, "--checkpoint-activations")["compute"] == pytest.approx(plain * 8 / 6)
    assert seconds(data, "--offload-activations", "--update-freq", "3")["compute"] == pytest.approx(3 * plain * 8 / 6)
