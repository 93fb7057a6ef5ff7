"""``--optimizer adam --memory-efficient-fp16`` (fairseq's LM recipes use it): the model is stored in fp16 and
adam keeps fp32 moments, stepping in fp32 (fairseq/optim/adam.py upcasts fp16 parameters the same way).
It trains as cpu_adam does with the same flags, single process and on 2 gloo ranks under pytorch_ddp and
legacy_ddp; fully_sharded refuses --memory-efficient-fp16 (it keeps fp32 shards: use --fp16)."""
import math

import pytest
import torch

from shardtrain.cli import train
from shardtrain.optim.cpu_adam import CPUAdam, for_fp16_parameters
from shardtrain.optim.optimizers import adam, FairseqAdamConfig
from st_testutils import json_records, make_space_data_bin, tiny_model_flags


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("me_adam")), n_words=12, train_tokens=2000,
                               valid_tokens=300, line_len=50, seed=2)


def test_adam_spec_becomes_fp32_state_adam_for_fp16_parameters():
    spec = for_fp16_parameters(adam(FairseqAdamConfig(adam_betas=(0.9, 0.98), weight_decay=0.1), torch.device("cpu")))
    assert spec.cls is CPUAdam and spec.kwargs["adamw_mode"] and spec.kwargs["betas"] == (0.9, 0.98)
    param = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    optimizer = spec.build([param], lr=0.1)
    param.grad = torch.full((3,), 1e-3, dtype=torch.float16)
    optimizer.step()
    assert param.dtype == torch.float16
    assert all(optimizer.state[param][k].dtype == torch.float32 for k in ("exp_avg", "exp_avg_sq"))
    no_decay = for_fp16_parameters(adam(FairseqAdamConfig(adamw_mode=False), torch.device("cpu")))
    assert no_decay.kwargs["adamw_mode"] is False


def run(data_bin, save_dir, optimizer, *extra):
    log = save_dir + ".log"
    train.main([data_bin, *tiny_model_flags(), "--save-dir", save_dir, "--log-file", log, "--max-update", "4",
                "--optimizer", optimizer, "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01",
                "--lr", "0.002", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2",
                "--memory-efficient-fp16", "--no-epoch-checkpoints", *extra])
    return torch.load(f"{save_dir}/checkpoint_last.pt", weights_only=True), json_records(log, "train_inner")


BACKENDS = {
    "single_process": [],
    "pytorch_ddp": ["--distributed-world-size", "2", "--ddp-backend", "pytorch_ddp"],
    "legacy_ddp": ["--distributed-world-size", "2", "--ddp-backend", "legacy_ddp"],
}


@pytest.mark.slow
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_adam_trains_with_memory_efficient_fp16(data_bin, tmp_path, backend):
    got, records = run(data_bin, str(tmp_path / "adam"), "adam", *BACKENDS[backend])
    want, _ = run(data_bin, str(tmp_path / "cpu_adam"), "cpu_adam", *BACKENDS[backend])
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in records) and records[-1]["loss"] < records[0]["loss"]
    assert all(t.dtype == torch.float16 for t in got["model"].values() if t.is_floating_point())
    for name, tensor in want["model"].items():
        torch.testing.assert_close(got["model"][name], tensor, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.flag_effect("--memory-efficient-bf16")
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_memory_efficient_bf16_stores_bf16_and_steps_fp32(data_bin, tmp_path, backend):
    """fairseq's --memory-efficient-bf16 (implies --bf16): the model in bf16, fp32 moments, no loss scale."""
    save_dir = str(tmp_path / "bf16")
    train.main([data_bin, *tiny_model_flags(), "--save-dir", save_dir, "--log-file", f"{save_dir}.log",
                "--max-update", "6", "--optimizer", "adam", "--lr", "0.003", "--lr-scheduler", "fixed",
                "--memory-efficient-bf16", *BACKENDS[backend]])
    records = json_records(f"{save_dir}.log", "train_inner")
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3, 4, 5, 6]
    assert all("loss_scale" not in r for r in records) and records[-1]["loss"] < records[0]["loss"]
    state = torch.load(f"{save_dir}/checkpoint_last.pt", weights_only=True)
    assert all(t.dtype == torch.bfloat16 for t in state["model"].values() if t.is_floating_point())
    moments = [v for s in state["optimizer"]["state"].values() for k, v in s.items() if k.startswith("exp_avg")]
    assert moments and all(m.dtype == torch.float32 for m in moments)
