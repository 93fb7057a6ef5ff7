"""--spike-rollback's snapshot (trainer/spike.py: a copy of this rank's parameter shards, buffers and
optimizer state, kept where the live tensors are) is counted by the pre-launch memory check and by
shard-plan, beside what it copies: on the GPU, or in host memory for what --cpu-offload keeps there
(issue 28, item 4).

The model: transformer_lm, 1 layer, width 8, ffn 16, 16 symbols, --tokens-per-sample 16:
embeddings 16 x 8 = 128, output projection 128, the layer 600 (q/k/v 3 x (64 + 8) = 216, out 64 + 8,
two layer norms 2 x 16, fc1 128 + 16, fc2 128 + 8): 856 parameters in 14 tensors; the sinusoidal
positions are a (16 + 2) x 8 fp32 buffer, 576 bytes. In fp32 with Adam: parameters 3,424 bytes,
optimizer state (two moments) 6,848, so a snapshot is 3,424 + 6,848 = 10,272 bytes of state and 576
of buffers."""
import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.plan.estimate import Machine
from shardtrain.plan.estimate import estimate as plan_estimate
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.loop import Run, train
from shardtrain.trainer.memory.fit import check_fits, memory_needs
from st_testutils import fit_estimate, make_space_data_bin

MODEL = ["--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "8",
         "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
         "--optimizer", "adam"]
SPIKE = ["--spike-rollback", "--spike-snapshot-interval", "1"]
STATE, BUFFERS = 10_272, 576
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("snapshot")), n_words=8, train_tokens=2000)


def _estimate(data, *flags, shards=1, device=CPU, state_on_host=False):
    return fit_estimate(parse_train_args([data, *MODEL, *flags]), shards=shards, device=device.type,
                        on_host=state_on_host)


def _added(data, device, state_on_host, ranks=1, shards=1):
    """What --spike-rollback adds to each place's need."""
    plain, spiked = (memory_needs(_estimate(data, *flags, shards=shards, device=device, state_on_host=state_on_host),
                                  ranks)
                     for flags in ([], SPIKE))
    return {where: spiked[where] - plain[where] for where in plain}


def test_the_memory_check_counts_the_snapshot_where_it_lives(data):
    assert _estimate(data).snapshot_state == 0 and _estimate(data).snapshot_buffers == 0
    assert (_estimate(data, *SPIKE).snapshot_state, _estimate(data, *SPIKE).snapshot_buffers) == (STATE, BUFFERS)
    assert _added(data, CPU, state_on_host=False) == {"host": STATE + BUFFERS}
    assert _added(data, CUDA, state_on_host=False) == {"host": 0, "device": STATE + BUFFERS}
    assert _added(data, CUDA, state_on_host=True) == {"host": STATE, "device": BUFFERS}  # --cpu-offload
    # fully_sharded over 2 CPU ranks on this host: each holds half the state, and all the buffers
    assert _added(data, CPU, state_on_host=False, ranks=2, shards=2) == {"host": 2 * (STATE // 2 + BUFFERS)}


def test_a_refusal_names_the_snapshot_and_how_to_drop_it(data):
    est = _estimate(data, *SPIKE, device=CUDA)
    with pytest.raises(ConfigError, match=r"--spike-rollback's snapshot 0\.0.*or leave out --spike-rollback"):
        check_fits(est, 1, available={"host": 2 ** 40, "device": 1000})


@pytest.mark.slow
def test_the_estimate_is_what_a_real_snapshot_holds(data, tmp_path):
    """A one-process run with --spike-rollback, after 2 updates: its snapshot's tensors are the parameters and
    buffers (3,424 + 576 bytes) and Adam's state: two moments (6,848) and a 4-byte step per parameter tensor
    (14 x 4), which the estimate leaves out (it stays a lower bound)."""
    cfg = parse_train_args([data, *MODEL, *SPIKE, "--batch-size", "4", "--max-update", "2", "--no-save",
                            "--disable-validation", "--log-format", "none", "--save-dir", str(tmp_path / "ck")])
    run = Run(cfg, make_context(0, 0, 1, use_cuda=False, backend=None))
    try:
        train(run)
        snapshot = run.spikes.snapshot
    finally:
        run.close()
    assert snapshot.update == 2
    assert sum(t.nbytes for t in snapshot.tensors) == 3_424 + BUFFERS
    optimizer = [v for state in snapshot.optimizer_state.values() for v in state.values() if torch.is_tensor(v)]
    assert sum(t.nbytes for t in optimizer) == 6_848 + 14 * 4
    assert all(t.device.type == "cpu" for t in snapshot.tensors + optimizer)


COUNT = 1_000_000
KINDS = {"params": 4 * COUNT, "gathered_params": 0, "grads": 4 * COUNT, "gathered_grads": 0,
         "optimizer": 8 * COUNT, "buffers": 3 * COUNT, "activations": 0, "temporaries": 0, "comm_buffers": 0}


def _plan(data, device, *flags):
    machine = Machine(device=device, world_size=1, ranks_per_node=1, gpu_bytes=2 ** 36, host_bytes=2 ** 36,
                      matmul_tflops={torch.float32: 1.0}, copy_gbps=1.0, network_gbps=1.0, pcie_gbps=1.0)
    return plan_estimate(parse_train_args([data, *MODEL, *flags]), dict(KINDS), COUNT, 1.0, 1, machine)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_shard_plan_counts_the_snapshot(data, device):
    """A traced step of 4 MB parameters, 8 MB Adam state and 3 MB buffers: the snapshot is 15 MB more at the
    peak, on the CPU's host or on the GPU."""
    plain, spiked = _plan(data, device), _plan(data, device, *SPIKE)
    assert plain.snapshot == 0 and spiked.snapshot == 15 * COUNT
    if device == "cpu":
        assert spiked.host_peak - plain.host_peak == 15 * COUNT
    else:
        assert (spiked.gpu_peak - plain.gpu_peak, spiked.host_peak - plain.host_peak) == (15 * COUNT, 0)


def test_shard_plan_keeps_an_offloaded_runs_snapshot_of_the_state_in_host_memory(data):
    flags = ["--ddp-backend", "fully_sharded", "--cpu-offload"]
    plain, spiked = _plan(data, "cuda", *flags), _plan(data, "cuda", *flags, *SPIKE)
    assert spiked.host_peak - plain.host_peak == 12 * COUNT  # parameters and optimizer state
    assert spiked.gpu_peak - plain.gpu_peak == 3 * COUNT  # the buffers stay on the GPU
