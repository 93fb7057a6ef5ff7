"""--async-save's host buffers (checkpoint/async_staging.py: RunStager) are counted by the pre-launch memory
check and by shard-plan (issue 37, item 1): with the state on the GPU, each rank keeps a pinned host copy of its
model and optimizer state from its first save to the end of the run, and the ranks of a node share its host
memory. State already in host memory (--cpu-offload's, cpu_adam's, a CPU run's) is written live, never copied.

The model (as tests/trainer/memory/test_spike_snapshot_memory.py's): transformer_lm, 1 layer, width 8, ffn 16, 16
symbols: embeddings 16 x 8 = 128, output projection 128, the layer 600 (q/k/v 3 x (64 + 8) = 216, out 64 + 8,
two layer norms 2 x 16, fc1 128 + 16, fc2 128 + 8): 856 parameters. fully_sharded over 2 ranks in fp32 with
Adam: each rank holds 856 x 4 / 2 = 1,712 bytes of parameters and 856 x 8 / 2 = 3,424 of moments, so each
stages 5,136 bytes, and a node with both ranks 10,272."""
import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.plan.estimate import Machine
from shardtrain.plan.estimate import estimate as plan_estimate
from shardtrain.plan.options import Option
from shardtrain.plan.planner import fits
from shardtrain.trainer.run_facts import run_facts
from shardtrain.trainer.memory.fit import check_fits, estimate, memory_needs
from shardtrain.trainer.resolved import Components, build_task
from st_testutils import make_space_data_bin

MODEL = ["--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "8",
         "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
         "--optimizer", "adam", "--ddp-backend", "fully_sharded"]
STAGED = 1_712 + 3_424  # per rank: its parameter shard and its moments
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("async_memory")), n_words=8, train_tokens=2000)


def _fit_estimate(data, *flags, device="cuda"):
    """The fit check's estimate of a rank of 2 on one node, and its facts."""
    cfg = parse_train_args([data, *MODEL, *flags])
    components = Components.of(cfg)
    facts = run_facts(cfg, components, 2, 2)
    return estimate(cfg, components, build_task(cfg, components), facts, device), facts


def _host(data, *flags, device=CUDA):
    est, facts = _fit_estimate(data, *flags, device=device.type)
    return memory_needs(est, 2)


def test_the_memory_check_counts_the_async_save_host_copy_on_every_rank_of_the_node(data):
    est, _ = _fit_estimate(data, "--async-save")
    assert (est.params, est.optimizer, est.staged) == (1_712, 3_424, STAGED)
    plain, staged = _host(data), _host(data, "--async-save")
    assert staged["host"] - plain["host"] == 2 * STAGED == 10_272  # both ranks' copies, in the node's memory
    assert staged["device"] == plain["device"]  # the GPU keeps what it had
    with pytest.raises(ConfigError, match=r"--async-save's host copy of the state .*leave out --async-save"):
        check_fits(est, 2, available={"host": plain["host"] + STAGED, "device": 2 ** 40})


def test_state_in_host_memory_is_written_live_so_nothing_is_staged(data):
    offloaded, _ = _fit_estimate(data, "--async-save", "--cpu-offload")
    assert offloaded.staged == 0
    assert _host(data, "--async-save", "--cpu-offload") == _host(data, "--cpu-offload")
    on_cpu, _ = _fit_estimate(data, "--async-save", "--cpu", device="cpu")
    assert on_cpu.staged == 0
    # only the model's shard is on the GPU when the optimizer steps in host memory (its moments stay there)
    cpu_adam, _ = _fit_estimate(data, "--async-save", "--optimizer", "cpu_adam")
    assert cpu_adam.staged == 1_712


def _machine(device="cuda", host_bytes=2 ** 40):
    return Machine(device=device, world_size=2, ranks_per_node=2, gpu_bytes=80 * 2 ** 30, host_bytes=host_bytes,
                   matmul_tflops={torch.float32: 1.0, torch.bfloat16: 2.0, torch.float16: 2.0},
                   copy_gbps=10.0, network_gbps=10.0, pcie_gbps=20.0)


# A traced rank of the run above (what a trace would give; only the state's kinds matter here)
KINDS = {"params": 1_712, "gathered_params": 0, "grads": 1_712, "gathered_grads": 0, "optimizer": 3_424,
         "buffers": 576, "activations": 10_000, "temporaries": 1_000, "comm_buffers": 0}


def _planned(data, *flags, device="cuda", option=None, host_bytes=2 ** 40):
    cfg = parse_train_args([data, *MODEL, *flags])
    cfg = option.apply(cfg) if option else cfg
    return plan_estimate(cfg, dict(KINDS), 856, 1000.0, 16, _machine(device, host_bytes))


def test_shard_plan_counts_the_async_save_host_copy(data):
    plain, staged = _planned(data), _planned(data, "--async-save")
    assert staged.staged == STAGED and staged.host_peak - plain.host_peak == STAGED  # per rank
    assert staged.gpu_peak == plain.gpu_peak
    # the node holds both ranks' copies: a host with room for the plain run's 2 ranks plus one copy is too small
    host = 2 * plain.host_peak + STAGED
    assert fits(plain, _machine(host_bytes=host), headroom=0.0)
    assert not fits(staged, _machine(host_bytes=host), headroom=0.0)
    assert _planned(data, "--async-save", "--cpu-offload").staged == 0
    assert _planned(data, "--async-save", "--optimizer", "cpu_adam").staged == 1_712
    assert _planned(data, "--async-save", "--cpu", device="cpu").staged == 0
    # an alternative whose backend writes single files saves synchronously: nothing staged
    ddp = Option("pytorch_ddp", (("distributed.ddp_backend", "pytorch_ddp"),))
    assert _planned(data, "--async-save", option=ddp).staged == 0


def test_the_memory_check_counts_the_backends_gradient_copies_as_shard_plan_does(data):
    """One estimator for both (trainer/memory/rank_memory.py): a rank of 2 under pytorch_ddp keeps a second copy of
    its 856 parameters' gradients in DDP's buckets (3,424 bytes), none with --gradient-as-bucket-view; the fit check
    used to count none."""
    ddp, _ = _fit_estimate(data, "--ddp-backend", "pytorch_ddp")
    assert (ddp.grads, ddp.extra) == (3_424, 3_424)
    as_view, _ = _fit_estimate(data, "--ddp-backend", "pytorch_ddp", "--gradient-as-bucket-view")
    assert as_view.extra == 0
    with_buckets, without = _host(data, "--ddp-backend", "pytorch_ddp"), _host(data, "--ddp-backend", "pytorch_ddp",
                                                                                "--gradient-as-bucket-view")
    assert (with_buckets["device"] - without["device"], with_buckets["host"] - without["host"]) == (3_424, 0)


def test_without_the_optimizer_state_only_the_parameters_are_staged(data):
    """--async-save --no-save-optimizer-state: a checkpoint without the optimizer's state stages the parameter shard
    alone (1,712 bytes a rank), in the fit check and in shard-plan alike; the moments (3,424) are not copied."""
    est, _ = _fit_estimate(data, "--async-save", "--no-save-optimizer-state")
    assert est.staged == 1_712
    assert _host(data, "--async-save", "--no-save-optimizer-state")["host"] - _host(data)["host"] == 2 * 1_712
    assert _planned(data, "--async-save", "--no-save-optimizer-state").staged == 1_712
