"""What torch and the CPU step allocate beyond the state, counted by the fit check and shard-plan (issue 45, items
2.6/4.2): the step during backward keeps a copy of each shard's parameter and moments where the update may be undone
(--clip-norm, fp16, --skip-nan-updates), and --cpu-offload's pinned shards are rounded up to powers of two. A 6.7B
model with --clip-norm needed about 178 GiB of host memory where the check said 99 and let it start.

The model: transformer_lm, 1 layer, width 12, ffn 20, 16 symbols: 1,568 parameters (embeddings 16 x 12 = 192, fused
q/k/v 36 x 12 + 36 = 468, out 12 x 12 + 12 = 156, two layer norms 48, fc1 20 x 12 + 20 = 260, fc2 12 x 20 + 12 = 252,
output projection 192), fully_sharded over 2 ranks of one node, --cpu-offload, cpu_adam (fp32 moments). Per rank:
parameters 1,568 x 4 / 2 = 3,136 bytes, gradients 3,136, moments 6,272, bookkeeping 14 tensors x 5,120 = 71,680.

Undo copies: 1,568 x (4 + 8) / 2 = 9,408 bytes a rank. Pinned rounding of each rank's fp32 shards (dim 0 halved, the
first chunk's length): embeddings 8 x 12 x 4 = 384 -> 512 (+128), q/k/v 18 x 12 x 4 = 864 -> 1,024 (+160), its
bias 72 -> 128 (+56), out 6 x 12 x 4 = 288 -> 512 (+224), its bias 24 -> 32 (+8), 4 layer-norm vectors 24 -> 32
(+32), fc1 10 x 12 x 4 = 480 -> 512 (+32), its bias 40 -> 64 (+24), fc2 6 x 20 x 4 = 480 -> 512 (+32), its bias
(+8), output projection (+128): 832 bytes a copy; the shards alone are pinned while the optimizer steps during
backward (its hook makes FSDP2 copy gradients into pageable memory), shards and gradients after it: 1,664."""
import functools
import types

import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.plan.estimate import Machine
from shardtrain.plan.estimate import estimate as plan_estimate
from shardtrain.plan.options import as_given
from shardtrain.plan.planner import Plan, Planned
from shardtrain.plan.report import _detail
from shardtrain.trainer.memory.host_memory import host_memory
from shardtrain.trainer.memory import fit as memory_fit
from shardtrain.trainer.memory.fit import check_fits, check_run_fits, estimate, memory_needs
from shardtrain.trainer.memory.pinned import pinned_block, shard_bytes
from shardtrain.trainer.resolved import Components, build_task
from shardtrain.trainer.run_facts import run_facts
from st_testutils import make_space_data_bin

MODEL = ["--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "12",
         "--decoder-ffn-embed-dim", "20", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
         "--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam"]
OFFLOAD = [*MODEL, "--cpu-offload"]
UNDO, PINNED = 9_408, 832  # a rank's, worked out above
OLD_HOST = 2 * (3_136 + 3_136 + 6_272 + 71_680)  # the node's two ranks as the old count had them: 168,448


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("step_copies")), n_words=8, train_tokens=2000)


@functools.lru_cache(maxsize=None)  # each estimate costs a few meta builds: tests share them
def _cached(data, flags, device):
    cfg = parse_train_args([data, *flags])
    components = Components.of(cfg)
    return estimate(cfg, components, build_task(cfg, components), run_facts(cfg, components, 2, 2), device)


def _estimate(data, flags, device="cuda"):
    """The fit check's estimate of one of 2 ranks on one node."""
    return _cached(data, tuple(flags), device)


def test_clipping_or_fp16_adds_the_undo_copies_of_each_shard(data):
    plain, clipped = _estimate(data, OFFLOAD), _estimate(data, [*OFFLOAD, "--clip-norm", "1.0"])
    assert memory_needs(clipped, 2)["host"] - memory_needs(plain, 2)["host"] == 2 * UNDO == 18_816
    assert (plain.undo, clipped.undo) == (0, UNDO)
    assert memory_needs(clipped, 2)["device"] == memory_needs(plain, 2)["device"]  # the copies are the host's
    for flags in (["--fp16"], ["--skip-nan-updates", "1"], ["--spike-rollback"]):  # an update they skip is undone
        assert _estimate(data, [*OFFLOAD, *flags]).undo == UNDO
    assert _estimate(data, [*OFFLOAD, "--clip-norm", "1.0", "--cpu-step", "after-backward"]).undo == 0
    assert _estimate(data, [*MODEL, "--clip-norm", "1.0"]).undo == 0  # shards on the GPU: cpu_adam steps after


def test_shard_plan_counts_the_undo_copies_too(data):
    machine = Machine(device="cuda", world_size=2, ranks_per_node=2, gpu_bytes=80 * 2 ** 30, host_bytes=2 ** 40,
                      matmul_tflops={torch.float32: 1.0, torch.bfloat16: 2.0, torch.float16: 2.0},
                      copy_gbps=10.0, network_gbps=10.0, pcie_gbps=20.0)
    kinds = {"params": 3_136, "grads": 3_136, "optimizer": 6_272, "buffers": 864, "activations": 1_000}
    cfg = parse_train_args([data, *OFFLOAD, "--clip-norm", "1.0"])
    plain, clipped = (plan_estimate(parse_train_args([data, *OFFLOAD, *flags]), dict(kinds), 1_568, 1000.0, 16,
                                    machine) for flags in ([], ["--clip-norm", "1.0"]))
    assert clipped.host_peak - plain.host_peak == UNDO and clipped.gpu_peak == plain.gpu_peak
    planned = Plan(machine, 1_568, 1000.0, (1, 16), Planned(as_given(), cfg, clipped, True), [], 0.1)
    printed = "\n".join(_detail(clipped, planned, "cuda"))
    assert "the CPU step during backward's copies (host)" in printed


def test_pinned_blocks_are_rounded_up_to_powers_of_two(data):
    assert [pinned_block(n) for n in (0, 1, 4_096, 4_097, 1_000_000)] == [0, 1, 4_096, 8_192, 1_048_576]
    assert shard_bytes((5, 3), 2, 4) == 36  # 3 rows of the first chunk, padded: 3 x 3 x 4
    during, after = _estimate(data, OFFLOAD), _estimate(data, [*OFFLOAD, "--cpu-step", "after-backward"])
    assert memory_needs(during, 2)["host"] == OLD_HOST + 2 * PINNED  # the node's 2 ranks
    assert (during.pinned, after.pinned) == (PINNED, 2 * PINNED)
    assert _estimate(data, OFFLOAD, device="cpu").pinned == 0  # pinned only where the shards travel to a GPU
    assert _estimate(data, MODEL).pinned == 0


def test_a_shard_pads_dim_0_and_keeps_every_other_dim():
    assert shard_bytes((5, 3, 2), 2, 4) == 72  # 3 rows of the first chunk x 3 x 2, fp32: every later dim counts
    assert shard_bytes((7,), 4, 2) == 4  # 2 of 7 rows (the first chunk's), bf16
    assert shard_bytes((), 2, 4) == 4  # a 0-dim parameter: one element on each rank, not split


def test_the_fit_check_refuses_what_the_old_count_let_through(data):
    clipped = _estimate(data, [*OFFLOAD, "--clip-norm", "1.0"])
    need = memory_needs(clipped, 2)["host"]
    assert need == OLD_HOST + 2 * (UNDO + PINNED) == 188_928
    free = {"host": OLD_HOST + 2 * PINNED + 2 * PINNED, "device": 2 ** 40}  # the old count fit, with room to spare
    with pytest.raises(ConfigError) as refused:
        check_fits(clipped, 2, available=free)
    message = str(refused.value)
    assert "\n" not in message and "CPU step during backward's copies of the state 0.0" in message
    assert "Make it fit with --cpu-step after-backward (" in message  # first: it alone makes the run fit
    check_fits(_estimate(data, [*OFFLOAD, "--clip-norm", "1.0", "--cpu-step", "after-backward"]), 2, available=free)


def test_the_runs_own_check_refuses_the_copies_on_a_cpu_run(data, monkeypatch, tmp_path):
    """check_run_fits, as Run calls it, against the machine-memory stand-in: a CPU run of one rank stepping during
    backward (--cpu-step during-backward) with --clip-norm keeps 1,568 x 12 = 18,816 bytes of copies."""
    flags = [*MODEL, "--cpu", "--cpu-step", "during-backward", "--clip-norm", "1.0"]
    cfg = parse_train_args([data, *flags])
    components = Components.of(cfg)
    task, facts = build_task(cfg, components), run_facts(cfg, components, 1, 1)
    est = estimate(cfg, components, task, facts, "cpu")
    root = tmp_path / "machine"  # the machine-memory stand-in: a /proc/meminfo of its own
    (root / "proc").mkdir(parents=True)
    free_kb = (memory_needs(est, 1)["host"] - 1_000) // 1024  # less than the copies short: the old count fit it
    (root / "proc/meminfo").write_text(f"MemAvailable: {free_kb} kB\n")
    monkeypatch.setattr(memory_fit, "host_memory", lambda *args: host_memory(str(root)))
    backend = types.SimpleNamespace(device=torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"Make it fit with --cpu-step after-backward \("):
        check_run_fits(cfg, components, task, backend, facts)
    after = parse_train_args([data, *MODEL, "--cpu", "--cpu-step", "after-backward", "--clip-norm", "1.0"])
    check_run_fits(after, components, task, backend, run_facts(after, components, 1, 1))
    assert est.undo == 18_816
