"""Every collective the trainer issues works when the default backend serves only
the accelerator, as NCCL serves only CUDA tensors (2 real ranks on CPU).

Under --cpu-offload the gradient shards and optimizer state are CPU tensors;
the gradient norm, clipping, the fp16 overflow decision, full state dicts and
adafactor's statistics reduce them over the model's mesh. With a plain "nccl"
group those collectives fail ("No backend type associated with device type
cpu"), which gloo-only CPU runs and 1-rank meshes never show. Here the ranks
join through launch's own code path with --distributed-backend set to a gloo
registered for the cuda device type only (accelerator_only_mains), so CPU
tensors are refused exactly as NCCL refuses them unless launch maps cpu:gloo.
"""
import functools
import math

import pytest

from accelerator_only_mains import ACCELERATOR_ONLY, register, train_variants
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.launch.rendezvous import process_group_backend
from st_testutils import make_space_data_bin

TESTS_ROOM = "shardtrain.trainer.parallel"  # it drives the commands: its imports cannot say which room it tests

UPDATES = 4
# fully_sharded + offload in fp16 (loss-scale agreement) with cpu_adam and clipping that fires,
# sharded async saves; hybrid + offload in bf16 with adafactor (row statistics over the mesh);
# pytorch_ddp + ZeRO (object broadcasts) in fp16 with clipping.
VARIANTS = {
    "fsdp_offload_fp16": ["--ddp-backend", "fully_sharded", "--cpu-offload", "--fp16", "--optimizer", "cpu_adam",
                          "--clip-norm", "1e-3", "--async-save"],
    "hybrid_offload_bf16_adafactor": ["--ddp-backend", "fully_sharded", "--fsdp-sharding-strategy", "hybrid_shard",
                                      "--shard-group-size", "1", "--cpu-offload", "--bf16", "--optimizer",
                                      "adafactor", "--lr", "1e-3", "--clip-norm", "1e-3"],
    "fsdp_adafactor": ["--ddp-backend", "fully_sharded", "--cpu-offload", "--optimizer", "adafactor", "--lr", "1e-3"],
    "ddp_zero_fp16": ["--ddp-backend", "pytorch_ddp", "--zero-sharding", "os", "--fp16", "--clip-norm", "1e-3"],
}


def test_backend_string_maps_cpu_to_gloo_beside_an_accelerator_only_backend():
    register()
    assert process_group_backend("nccl") == "cuda:nccl,cpu:gloo"
    assert process_group_backend(ACCELERATOR_ONLY) == f"cuda:{ACCELERATOR_ONLY},cpu:gloo"
    assert process_group_backend("gloo") == "gloo"  # serves both already
    assert process_group_backend("cuda:nccl,cpu:gloo") == "cuda:nccl,cpu:gloo"  # a map given by the user


def _cfg(data_bin, save_dir, extra):
    cfg = parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--required-batch-size-multiple", "1", "--max-update", str(UPDATES),
        "--save-interval-updates", "2", "--validate-interval-updates", "2", "--save-dir", save_dir,
        "--cpu", "--threads", "1", "--log-format", "none", "--distributed-world-size", "2",
        "--heartbeat-timeout", "600", *extra])  # a starved rank may lag the other by minutes under load
    cfg.distributed.distributed_backend = ACCELERATOR_ONLY  # not a --distributed-backend choice
    return cfg


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
def test_every_collective_passes_with_an_accelerator_only_default_backend(tmp_path):
    data_bin = make_space_data_bin(str(tmp_path / "data"), n_words=8, train_tokens=1500, valid_tokens=200,
                                   line_len=40)
    configs = [_cfg(data_bin, str(tmp_path / name), extra) for name, extra in VARIANTS.items()]
    seen = call_main(configs[0], functools.partial(train_variants, configs=configs))

    assert seen["backend_config"] == f"cuda:{ACCELERATOR_ONLY},cpu:gloo"
    assert "No backend type associated with device type cpu" in seen["refusal"]  # NCCL's condition holds
    runs = dict(zip(VARIANTS, seen["runs"]))
    for name, run in runs.items():
        assert len(run["updates"]) == UPDATES, name
        assert all(u["stepped"] and math.isfinite(u["gnorm"]) and u["gnorm"] > 0 for u in run["updates"]), name
        assert run["valid_loss"] is not None and math.isfinite(run["valid_loss"]), name
    for name in ("fsdp_offload_fp16", "hybrid_offload_bf16_adafactor", "ddp_zero_fp16"):
        assert all(u["clip"] == 1.0 for u in runs[name]["updates"]), name  # the clipping path ran
    for name in ("fsdp_offload_fp16", "ddp_zero_fp16"):
        assert all(u["loss_scale"] for u in runs[name]["updates"]), name
    for name in ("fsdp_offload_fp16", "hybrid_offload_bf16_adafactor"):
        assert (tmp_path / name / "checkpoint_last").is_dir(), name  # sharded save (async in the first)
    assert (tmp_path / "ddp_zero_fp16" / "checkpoint_last.pt").is_file()
