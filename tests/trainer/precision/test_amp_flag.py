"""--amp: fairseq's automatic mixed precision (fairseq/optim/amp_optimizer.py): fp16 autocast, fp32 weights,
a dynamic loss scale starting at --amp-init-scale and growing after --amp-scale-window clean updates (torch
GradScaler's 2000 by default). Here that is the --fp16 precision with the --amp-* scale flags: an --amp run
trains exactly as the --fp16 run with the same scale, under every backend (2 gloo ranks, all in one spawn)."""
import pytest
import torch

from shardtrain.cli import train
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer import loop
from shardtrain.trainer.precision.choose import run_dtypes
from shardtrain.trainer.precision.fp16 import build_scaler
from st_testutils import json_records, last_checkpoint_state, make_space_data_bin, tiny_model_flags
from one_spawn import call_each


@pytest.mark.flag_effect("--amp", "--amp-init-scale", "--amp-scale-window")
def test_amp_is_fp16_compute_with_fp32_weights_and_its_own_scale_flags():
    cfg = parse_train_args(["data-bin", "--amp"])
    assert (cfg.common.amp_batch_retries, cfg.common.amp_init_scale, cfg.common.amp_scale_window) == (2, 128, None)
    dtypes = run_dtypes(cfg)
    assert dtypes.name == "fp16" and dtypes.compute == torch.float16 and dtypes.storage is None
    scaler = build_scaler(cfg, world_size=4)
    assert (scaler.loss_scale, scaler.scale_window) == (128.0, 2000)
    scaler = build_scaler(parse_train_args(["data-bin", "--amp", "--amp-init-scale", "8",
                                            "--amp-scale-window", "5"]), world_size=1)
    assert (scaler.loss_scale, scaler.scale_window) == (8.0, 5)
    # with --fp16 as well, the --fp16-* flags decide, as fairseq's fp16 path does
    scaler = build_scaler(parse_train_args(["data-bin", "--amp", "--fp16", "--fp16-init-scale", "4"]), world_size=1)
    assert (scaler.loss_scale, scaler.scale_window) == (4.0, 2 ** 14)


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("amp")), n_words=12, train_tokens=2000,
                               valid_tokens=300, line_len=50, seed=4)


# --peak-tflops: mfu against a given peak; a CPU matmul peak measured while the machine is busy can read
# below the run's own speed, and mfu is then left out of the records (test_mfu.py tests the measured one)
FLAGS = ["--max-update", "4", "--lr", "0.002", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2",
         "--no-epoch-checkpoints", "--peak-tflops", "1000"]
# a huge initial scale overflows: the first updates are skipped and the scale halves, in both runs
AMP = ["--amp", "--amp-init-scale", "65536", "--amp-scale-window", "3"]
FP16 = ["--fp16", "--fp16-init-scale", "65536", "--fp16-scale-window", "3"]


def argv(data_bin, save_dir, *extra):
    return [data_bin, *tiny_model_flags(), *FLAGS, "--save-dir", save_dir, "--log-file", f"{save_dir}.log", *extra]


def outcome(save_dir):
    return last_checkpoint_state(save_dir), json_records(f"{save_dir}.log", "train_inner")


BACKENDS = {
    "single_process": [],
    "pytorch_ddp": ["--distributed-world-size", "2", "--ddp-backend", "pytorch_ddp"],
    "legacy_ddp": ["--distributed-world-size", "2", "--ddp-backend", "legacy_ddp"],
    "fully_sharded": ["--distributed-world-size", "2", "--ddp-backend", "fully_sharded"],
}


@pytest.fixture(scope="module")
def two_rank_dirs(data_bin, tmp_path_factory):
    """The save dirs {backend: (amp, fp16)} of every 2-rank backend's two runs, trained in one spawn."""
    root = tmp_path_factory.mktemp("two_ranks")
    dirs = {b: (str(root / f"{b}_amp"), str(root / f"{b}_fp16")) for b in BACKENDS if BACKENDS[b]}
    call_each([(loop.main, parse_train_args(argv(data_bin, save_dir, *precision, *BACKENDS[b])))
               for b, pair in dirs.items() for save_dir, precision in zip(pair, (AMP, FP16))])
    return dirs


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--amp", "--amp-init-scale", "--amp-scale-window")
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_amp_trains_as_fp16_with_the_same_scale(data_bin, tmp_path, backend, request):
    if BACKENDS[backend]:
        amp_dir, fp16_dir = request.getfixturevalue("two_rank_dirs")[backend]
    else:  # through the command's main
        amp_dir, fp16_dir = str(tmp_path / "amp"), str(tmp_path / "fp16")
        train.main(argv(data_bin, amp_dir, *AMP))
        train.main(argv(data_bin, fp16_dir, *FP16))
    (amp, records), (fp16, fp16_records) = outcome(amp_dir), outcome(fp16_dir)
    keys = ("num_updates", "loss", "gnorm", "loss_scale")
    assert [[r[k] for k in keys] for r in records] == [[r[k] for k in keys] for r in fp16_records]
    assert records[0]["loss_scale"] < 65536  # it did overflow and lower the scale
    world = 2 if BACKENDS[backend] else 1
    for r in records:  # tokens/s per device: the ranks' summed wps over the world size
        assert r["wps_per_device"] == pytest.approx(r["wps"] / world, abs=0.1) and r["mfu"] > 0
    assert amp["precision"] == fp16["precision"]
    for name, tensor in fp16.get("model", {}).items():  # fully_sharded keeps the weights in shard files
        assert amp["model"][name].dtype == torch.float32  # fp32 weights
        torch.testing.assert_close(amp["model"][name], tensor, rtol=0, atol=0)
