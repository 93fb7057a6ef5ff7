"""benchmarks/gpu/scenarios.py cannot run here (no GPU), but its plumbing can: every scenario's
flags must parse and pass the compatibility checks, its assertions and figures must work on records
shaped like shard-train's, the headline's lr is real within its 30 updates, skipped fp16 updates are
counted from what shard-train really logs, and the host memory and peak come from shardtrain's own."""
import math
import os
import sys

import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.memory import fit as memory_fit
from shardtrain.trainer.build import build_lr_scheduler
from shardtrain.trainer.resolved import Components

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gpu"))
import runs  # noqa: E402
import scenarios  # noqa: E402


def fake_train(seen, skipped=0, commands=None):
    def train(data_bin, workdir, name, flags, timeout=900):
        cfg = parse_train_args([data_bin, *flags])  # unknown flags and incompatible ones fail here
        if commands is not None:
            commands[name] = list(flags)
        updates = cfg.optimization.max_update
        during = cfg.distributed.cpu_step == "during-backward"
        # ups as shard-train rounds it (2 decimals); train_wall the update's seconds (issue 45, 2.2)
        offload = {"ups": 0.12 if during else 0.1, "train_wall": 8.13 if during else 10.0, "mfu": 31.0,
                   "offload_fwd_bwd": 6.0, "offload_upload": 0.5, "offload_grad_wait": 0.25, "offload_cpu_step": 5.0,
                   "offload_step_exposed": 2.0 if during else 5.0,
                   "offload_hidden": 60.0 if during else 0.0} if cfg.distributed.cpu_step != "auto" else {}
        inner = [{"loss": 10.0 - 0.01 * i, "wps": 1000.0, "gb_peak_alloc": 10.0 + (name == "headline-uf4"),
                  "gb_rss": 5.0, **({"loss_scale": 128.0} if cfg.common.fp16 else {}), **offload}
                 for i in range(updates)]
        seen.append(name)
        return {"records": {"train_inner": inner, "valid": [{"loss": 3.0}]}, "seconds": 1.0, "log": "",
                "skipped": skipped if cfg.common.fp16 else 0, "params": 6_657_048_576}  # the built gpt3_6_7
    return train


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return runs.learnable_data_bin(str(tmp_path_factory.mktemp("gpu-data") / "data-bin"), vocab=500, tokens=20_000)


def test_every_scenario_runs_on_fake_records(data_bin, tmp_path, monkeypatch):
    seen, commands = [], {}
    monkeypatch.setattr(scenarios, "train", fake_train(seen, skipped=3, commands=commands))
    monkeypatch.setattr(scenarios, "peak_flops", lambda: 989e12)
    monkeypatch.setattr(scenarios.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(scenarios, "host_available_bytes", lambda: 128 * 2 ** 30)  # the H100 node's host
    found = {}
    for name, scenario in scenarios.SCENARIOS.items():
        rows, results = scenarios.collected(scenario, data_bin, str(tmp_path))
        assert rows and results, name
        for result, value, target in results:
            assert target[:2] in ("<=", ">=", "") and value == value, (name, result)  # no NaN
            found[result] = value
        if name == "precision":
            assert [r["skipped updates"] for r in rows] == [3, "-"]  # fp16 skipped 3; bf16 has no scaler
    assert len(seen) == 12  # offload-largest 2, headline 3, mfu 1, precision 2, compile 2, llama 2
    assert found["headline_uf1_gpu_peak_gib"] == 10.0 and found["headline_uf4_gpu_peak_gib"] == 11.0
    # issue 39's case: 6.7B fits 128 GiB at 16 bytes a parameter; 8 s an update during backward, 10 s after it
    assert seen[:2] == ["offload-during-backward", "offload-after-backward"]
    # the run's own parameter count, not the table's 6.7 (issue 45, 2.7); seconds from train_wall, not 1/ups
    # (2.2: 1/0.12 over 1/0.1 would be 0.833)
    assert found["offload_largest_params_billion"] == 6.657048576 and found["offload_largest_mfu"] == 0.31
    assert found["headline_params_billion"] == 6.657048576
    assert found["offload_largest_step_ratio"] == pytest.approx(0.813)
    assert found["offload_largest_hidden_percent"] == 60.0
    # issue 46, item 8: PaLM's count from the run's own parameters, by hand: 1000 words/s x (6 x 6,657,048,576 +
    # 12 x 16 x 2048 x 2048 = 40,747,597,824 FLOP a token) / 989e12; at 8,192 tokens 43,163,516,928 FLOP a token
    assert found["llama_1b_mfu"] == pytest.approx(0.0412008, rel=1e-5)
    assert found["llama_1b_doc_mask_8k_mfu"] == pytest.approx(0.0436436, rel=1e-5)
    assert found["llama_1b_words_per_s"] == found["llama_1b_doc_mask_8k_words_per_s"] == 1000.0
    masked, plain = commands["llama-doc_mask_8k"], commands["llama-2k"]
    assert " ".join(masked).endswith("--tokens-per-sample 8192 --batch-size 1 --attn-mask-type block_causal")
    assert "--attn-mask-type" not in plain and plain[-4:] == ["--tokens-per-sample", "2048", "--batch-size", "4"]
    assert masked[:2] == plain[:2] == ["--arch", "llama3_2_1b"] and "--bf16" in masked and "fully_sharded" in masked


def test_the_document_mask_case_parses_with_its_flag(data_bin):
    """The 8k case's --attn-mask-type block_causal reaches the task's config (the whole command parses above)."""
    cfg = parse_train_args([data_bin, *scenarios.LLAMA_FLAGS, *scenarios.LLAMA_SETTINGS["doc_mask_8k"]])
    assert cfg.task.attn_mask_type == "block_causal" and cfg.task.tokens_per_sample == 8192


def test_the_headline_lr_is_real_within_its_30_updates(data_bin):
    """The default schedule (inverse_sqrt, 4,000 warm-up updates from 1e-7) gave 1.6e-6 at update 30."""
    cfg = parse_train_args([data_bin, "--arch", "transformer_lm_gpt3_small", *scenarios.HEADLINE_FLAGS])
    scheduler = build_lr_scheduler(cfg, Components.of(cfg), torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))
    lrs = [scheduler.step_update(n) for n in range(1, 31)]
    assert lrs[4:] == pytest.approx([2e-4] * 26)  # --lr 2e-4 from update 5 (5 warm-up updates)
    assert lrs[0] == pytest.approx(2e-4 * 2 / 5)


@pytest.mark.slow
def test_skipped_updates_are_counted_from_what_shard_train_logs(data_bin, tmp_path):
    """A real fp16 run on the CPU whose loss scale starts far too high: each overflow halves it
    (no growth within the window), so the skips are log2(initial scale / first record's scale)."""
    flags = ["--cpu", "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
             "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "32",
             "--batch-size", "2", "--fp16", "--fp16-init-scale", str(2 ** 30), "--fp16-scale-window", "1000",
             "--max-update", "3", "--no-save", "--disable-validation", "--optimizer", "adam", "--lr", "1e-4"]
    run = runs.train(data_bin, str(tmp_path), "overflow", flags, timeout=600)
    inner = run["records"]["train_inner"]
    assert len(inner) == 3  # a skipped update writes no record and does not count
    assert all(r["train_wall"] > 0 for r in inner)  # what the offload scenario's seconds are read from
    # the built model's count from its log: embeddings and output 504 x 16 each, one layer 2,224 (issue 45, 2.7)
    assert run["params"] == 2 * 504 * 16 + 2_224
    halvings = math.log2(2 ** 30 / inner[0]["loss_scale"])
    assert halvings >= 5 and run["skipped"] == halvings, (run["skipped"], inner[0]["loss_scale"])


def test_the_host_memory_and_the_peak_are_shardtrains(monkeypatch):
    # cgroup-aware (tests/trainer/memory/test_host_memory.py), where /proc/meminfo's MemAvailable is not
    assert scenarios.host_available_bytes is memory_fit.host_available_bytes
    monkeypatch.setattr(scenarios, "host_available_bytes", lambda: 100 * 2 ** 30)  # a 100 GiB container
    assert scenarios.largest_fitting_arch()[0] == "transformer_lm_gpt3_2_7"  # 54 GB of 80 GiB, not 6.7B's 134
    monkeypatch.setattr(scenarios.torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 NVL")
    assert scenarios.peak_flops() == 835.5e12
    monkeypatch.setattr(scenarios.torch.cuda, "get_device_name", lambda i=0: "NVIDIA L40")
    assert scenarios.peak_flops() == 181e12
    monkeypatch.setattr(scenarios.torch.cuda, "get_device_name", lambda i=0: "NVIDIA A10G")
    assert math.isnan(scenarios.peak_flops())


def test_learnable_data_is_learnable(data_bin):
    from shardtrain.data.indexed_dataset import MMapIndexedDataset

    train = MMapIndexedDataset(os.path.join(data_bin, "train"))
    tokens = [int(t) for i in range(len(train)) for t in train[i][:-1]]
    successors = {}
    for a, b in zip(tokens, tokens[1:]):
        successors.setdefault(a, set()).add(b)
    assert max(len(s) for s in successors.values()) <= 4  # at most 2 bits per token to learn
