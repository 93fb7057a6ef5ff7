"""Sharded (DCP) checkpoints under fully_sharded: exact resume, and resume on 1, 2 or 3 ranks.

The global batch is kept the same across world sizes (ranks x --update-freq = 6
batches per update), so a resumed run must reproduce the uninterrupted run's
losses: DCP reshards the model and optimizer, and the data iterator continues
from the same global position.
"""
import os
import shutil

import numpy as np
import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.checkpoint.save_dir_lock import LOCK_NAME
from equivalence_mains import train_and_record
from st_testutils import make_space_data_bin

TOTAL, HALF = 8, 4


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("ckpt")), n_words=8, train_tokens=8000,
                               valid_tokens=200, line_len=40)


def run(data_bin, save_dir, world_size, max_update, backend="fully_sharded", dropout="0", *extra):
    cfg = parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--required-batch-size-multiple", "1", "--dropout", dropout, "--optimizer", "sgd",
        "--momentum", "0.9", "--lr", "0.5", "--lr-scheduler", "fixed", "--max-update", str(max_update),
        "--disable-validation", "--cpu", "--threads", "1", "--log-format", "none", "--save-dir", str(save_dir),
        "--ddp-backend", backend, "--distributed-world-size", str(world_size),
        "--update-freq", str(6 // world_size), "--heartbeat-timeout", "60", *extra])
    return call_main(cfg, train_and_record)


@pytest.fixture(scope="module")
def reference(data_bin, tmp_path_factory):
    return run(data_bin, tmp_path_factory.mktemp("ref"), 1, TOTAL, backend="pytorch_ddp")[0]


@pytest.fixture(scope="module")
def saved_on_two_ranks(data_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("two") / "ck"
    losses = run(data_bin, save, 2, HALF)[0]
    return save, losses


@pytest.mark.slow
def test_sharded_checkpoint_layout(saved_on_two_ranks):
    save, _ = saved_on_two_ranks
    last = save / "checkpoint_last"
    assert last.is_symlink() and (last / "COMPLETE").exists()
    shards = sorted(p.name for p in last.iterdir() if p.suffix == ".distcp")
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shards
    assert not [p for p in save.iterdir() if p.name.startswith(".") and p.name != LOCK_NAME]  # no partial dirs


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 1, 3])
def test_resume_on_any_number_of_ranks_continues_exactly(world_size, data_bin, reference, saved_on_two_ranks,
                                                         tmp_path):
    save, first_half = saved_on_two_ranks
    np.testing.assert_allclose(first_half, reference[:HALF], rtol=1e-5)
    copy = tmp_path / "ck"
    shutil.copytree(save, copy, symlinks=True)
    second_half = run(data_bin, copy, world_size, TOTAL)[0]
    np.testing.assert_allclose(second_half, reference[HALF:], rtol=1e-5)


@pytest.mark.slow
def test_one_rank_checkpoint_resumes_on_two(data_bin, reference, tmp_path):
    save = tmp_path / "ck"
    run(data_bin, save, 1, HALF)
    assert os.path.isdir(save / "checkpoint_last")
    np.testing.assert_allclose(run(data_bin, save, 2, TOTAL)[0], reference[HALF:], rtol=1e-5)


@pytest.mark.slow
def test_two_rank_resume_is_exact_with_dropout(data_bin, tmp_path):
    """Every rank's RNG stream is saved and restored, so dropout masks continue too."""
    straight = run(data_bin, tmp_path / "straight", 2, TOTAL, dropout="0.2")[0]
    split = tmp_path / "split"
    first = run(data_bin, split, 2, HALF, dropout="0.2")[0]
    second = run(data_bin, split, 2, TOTAL, dropout="0.2")[0]
    assert first + second == straight  # bit-identical


@pytest.mark.slow
def test_async_save_resumes_exactly(data_bin, reference, tmp_path):
    """--async-save (saving after every update, in the background) keeps resume exact and atomic."""
    save = tmp_path / "ck"
    run(data_bin, save, 2, HALF, "fully_sharded", "0", "--async-save", "--save-interval-updates", "1",
        "--keep-interval-updates", "2")
    # --keep-interval-updates 2 pruned the older directories; checkpoint_last points to the newest
    assert sorted(p.name for p in save.iterdir() if p.name != LOCK_NAME) == [
        "checkpoint_1_3", "checkpoint_1_4", "checkpoint_last", "config.yaml"]
    assert os.readlink(save / "checkpoint_last") == "checkpoint_1_4"
    np.testing.assert_allclose(run(data_bin, save, 2, TOTAL, "fully_sharded", "0", "--async-save")[0],
                               reference[HALF:], rtol=1e-5)


@pytest.mark.slow
def test_every_form_resumes_under_another_backend(data_bin, reference, saved_on_two_ranks, tmp_path):
    # sharded (fully_sharded) -> pytorch_ddp
    sharded = tmp_path / "sharded"
    shutil.copytree(saved_on_two_ranks[0], sharded, symlinks=True)
    np.testing.assert_allclose(run(data_bin, sharded, 2, TOTAL, "pytorch_ddp")[0], reference[HALF:], rtol=1e-5)
    # single file (pytorch_ddp) -> fully_sharded
    single = tmp_path / "single"
    run(data_bin, single, 2, HALF, "pytorch_ddp")
    assert (single / "checkpoint_last.pt").is_file()
    np.testing.assert_allclose(run(data_bin, single, 2, TOTAL)[0], reference[HALF:], rtol=1e-5)


@pytest.mark.slow
def test_missing_shard_is_a_clear_error(data_bin, saved_on_two_ranks, tmp_path, capsys):
    from shardtrain.cli import train

    broken = tmp_path / "ck"
    shutil.copytree(saved_on_two_ranks[0], broken, symlinks=True)
    os.remove(broken / "checkpoint_last" / "__1_0.distcp")
    with pytest.raises(SystemExit) as info:
        train.main([data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
                    "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
                    "--batch-size", "4", "--optimizer", "sgd", "--momentum", "0.9", "--lr-scheduler", "fixed",
                    "--ddp-backend", "fully_sharded", "--cpu", "--save-dir", str(broken), "--max-update", "6"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "shard file is missing or damaged" in err and "Traceback" not in err


@pytest.mark.slow
def test_finetune_from_a_sharded_checkpoint(data_bin, saved_on_two_ranks, tmp_path):
    """--finetune-from-model takes a sharded directory too: its weights, fresh counters."""
    source = saved_on_two_ranks[0] / "checkpoint_last"
    losses, weights, _ = run(data_bin, tmp_path / "ft", 1, 1, "pytorch_ddp", "0",
                             "--finetune-from-model", str(source), "--lr", "1e-9")
    # a negligible lr: the finetuned weights are the source's, which DCP assembles from both ranks' shards
    from shardtrain.trainer.checkpoint.consolidate import read_sharded  # what shard-consolidate writes

    source_weights = read_sharded(str(source), model_only=True)["model"]
    for k, v in source_weights.items():
        np.testing.assert_allclose(weights[k], v.numpy(), atol=1e-6)
    assert len(losses) == 1  # one update: the counters started from zero


@pytest.mark.slow
def test_sharded_checkpoint_of_another_architecture_is_refused(data_bin, saved_on_two_ranks, tmp_path, capsys):
    from shardtrain.cli import train

    copy = tmp_path / "ck"
    shutil.copytree(saved_on_two_ranks[0], copy, symlinks=True)
    before = sorted(p.name for p in copy.iterdir())
    with pytest.raises(SystemExit) as info:
        train.main([data_bin, "--arch", "transformer_lm", "--decoder-layers", "3", "--decoder-embed-dim", "16",
                    "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
                    "--batch-size", "4", "--ddp-backend", "fully_sharded", "--cpu", "--save-dir", str(copy),
                    "--max-update", "6"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "saved with another model" in err and "Traceback" not in err
    assert sorted(p.name for p in copy.iterdir()) == before
