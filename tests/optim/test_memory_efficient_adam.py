"""``--optimizer adam --memory-efficient-fp16`` (fairseq's LM recipes use it): the model is stored in fp16 and
adam keeps fp32 moments, stepping in fp32 (fairseq/optim/adam.py upcasts fp16 parameters the same way).
It trains as cpu_adam does with the same flags, single process and on 2 gloo ranks under pytorch_ddp and
legacy_ddp (every 2-rank run in one spawn); fully_sharded refuses --memory-efficient-fp16 (it keeps fp32 shards:
use --fp16)."""
import math

import pytest
import torch

from shardtrain.cli import train
from shardtrain.config.run_config import parse_train_args
from shardtrain.optim.cpu_adam import CPUAdam, for_fp16_parameters
from shardtrain.optim.optimizers import adam, FairseqAdamConfig
from shardtrain.trainer import loop
from st_testutils import json_records, make_space_data_bin, tiny_model_flags
from one_spawn import call_each


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


def adam_argv(data_bin, save_dir, optimizer, *extra):
    return [data_bin, *tiny_model_flags(), "--save-dir", save_dir, "--log-file", save_dir + ".log", "--max-update", "4",
            "--optimizer", optimizer, "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01",
            "--lr", "0.002", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2",
            "--memory-efficient-fp16", "--no-epoch-checkpoints", *extra]


def bf16_argv(data_bin, save_dir, *extra):
    return [data_bin, *tiny_model_flags(), "--save-dir", save_dir, "--log-file", f"{save_dir}.log",
            "--max-update", "6", "--optimizer", "adam", "--lr", "0.003", "--lr-scheduler", "fixed",
            "--memory-efficient-bf16", *extra]


def outcome(save_dir):
    state = torch.load(f"{save_dir}/checkpoint_last.pt", weights_only=True)
    return state, json_records(save_dir + ".log", "train_inner")


BACKENDS = {
    "single_process": [],
    "pytorch_ddp": ["--distributed-world-size", "2", "--ddp-backend", "pytorch_ddp"],
    "legacy_ddp": ["--distributed-world-size", "2", "--ddp-backend", "legacy_ddp"],
}


@pytest.fixture(scope="module")
def two_rank_dirs(data_bin, tmp_path_factory):
    """{backend: {"adam", "cpu_adam", "bf16": save dir}} of every 2-rank backend's runs, trained in one spawn."""
    root = tmp_path_factory.mktemp("two_ranks")
    dirs, jobs = {}, []
    for b in (b for b in BACKENDS if BACKENDS[b]):
        dirs[b] = {name: str(root / f"{b}_{name}") for name in ("adam", "cpu_adam", "bf16")}
        jobs += [(loop.main, parse_train_args(adam_argv(data_bin, dirs[b][o], o, *BACKENDS[b])))
                 for o in ("adam", "cpu_adam")]
        jobs.append((loop.main, parse_train_args(bf16_argv(data_bin, dirs[b]["bf16"], *BACKENDS[b]))))
    call_each(jobs)
    return dirs


def save_dirs(request, backend, tmp_path, *names):
    """The save dirs of ``names``: the spawn's for 2 ranks; for one, run here through the command's main."""
    if BACKENDS[backend]:
        return [request.getfixturevalue("two_rank_dirs")[backend][name] for name in names]
    return [str(tmp_path / name) for name in names]


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_adam_trains_with_memory_efficient_fp16(data_bin, tmp_path, backend, request):
    adam_dir, cpu_adam_dir = save_dirs(request, backend, tmp_path, "adam", "cpu_adam")
    if not BACKENDS[backend]:
        train.main(adam_argv(data_bin, adam_dir, "adam"))
        train.main(adam_argv(data_bin, cpu_adam_dir, "cpu_adam"))
    (got, records), (want, _) = outcome(adam_dir), outcome(cpu_adam_dir)
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in records) and records[-1]["loss"] < records[0]["loss"]
    assert all(t.dtype == torch.float16 for t in got["model"].values() if t.is_floating_point())
    for name, tensor in want["model"].items():
        torch.testing.assert_close(got["model"][name], tensor, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--memory-efficient-bf16")
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_memory_efficient_bf16_stores_bf16_and_steps_fp32(data_bin, tmp_path, backend, request):
    """fairseq's --memory-efficient-bf16 (implies --bf16): the model in bf16, fp32 moments, no loss scale."""
    save_dir, = save_dirs(request, backend, tmp_path, "bf16")
    if not BACKENDS[backend]:
        train.main(bf16_argv(data_bin, save_dir))
    state, records = outcome(save_dir)
    assert [int(r["num_updates"]) for r in records] == [1, 2, 3, 4, 5, 6]
    assert all("loss_scale" not in r for r in records) and records[-1]["loss"] < records[0]["loss"]
    assert all(t.dtype == torch.bfloat16 for t in state["model"].values() if t.is_floating_point())
    moments = [v for s in state["optimizer"]["state"].values() for k, v in s.items() if k.startswith("exp_avg")]
    assert moments and all(m.dtype == torch.float32 for m in moments)
