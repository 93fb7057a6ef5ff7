"""--async-save snapshots the state before save() returns, into one reused buffer.

Two real gloo ranks under fully_sharded: right after each async save() returns,
every parameter and optimizer moment is changed in place (as the next optimizer
step would), then the checkpoint must hold the values at save(), not a mix. The
second save checks the run's one stager is reused and refreshed, not rebuilt.
"""
import pytest
import torch

from shardtrain.config.build import parse_train_args
from shardtrain.trainer.async_staging import staging_options
from shardtrain.trainer.launch import call_main
from async_save_mains import save_mutate_load
from st_testutils import make_space_data_bin


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("async")), n_words=8, train_tokens=4000,
                               valid_tokens=200, line_len=40)


def test_async_save_is_a_snapshot_and_reuses_one_stager(data_bin, tmp_path):
    cfg = parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--optimizer", "adam", "--lr", "0.01", "--max-update", "2",
        "--disable-validation", "--no-save", "--cpu", "--threads", "1", "--log-format", "none",
        "--save-dir", str(tmp_path), "--ddp-backend", "fully_sharded", "--distributed-world-size", "2",
        "--heartbeat-timeout", "60"])
    differences, created, same_stager = call_main(cfg, save_mutate_load)
    assert differences == [0.0, 0.0], "a checkpoint holds values changed after its save() returned (torn)"
    assert created == 1 and same_stager, "the stager must be made once per run, not per save"


def test_staging_options_follow_the_state_device():
    cpu = staging_options(torch.device("cpu"))
    assert not cpu.use_pinned_memory and not cpu.use_non_blocking_copy  # pinning CPU state only locks RAM
    assert not cpu.use_async_staging  # the snapshot is whole when save() returns
    gpu = staging_options(torch.device("cuda", 0))
    assert gpu.use_pinned_memory and gpu.use_non_blocking_copy and not gpu.use_async_staging
