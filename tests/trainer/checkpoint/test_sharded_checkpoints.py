"""Sharded (DCP) checkpoints under fully_sharded: exact resume, and resume on 1, 2 or 3 ranks.

The global batch is kept the same across world sizes (ranks x --update-freq = 6
batches per update), so a resumed run must reproduce the uninterrupted run's
losses: DCP reshards the model and optimizer, and the data iterator continues
from the same global position. The 2-rank runs are shared (sharded_story.py):
two spawns hold them all.
"""
import os

import numpy as np
import pytest

from shardtrain.trainer.checkpoint.save_dir_lock import LOCK_NAME
import sharded_story
from sharded_story import HALF, TOTAL, run

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return sharded_story.data_bin(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(data_bin, tmp_path_factory):
    return run(data_bin, tmp_path_factory.mktemp("ref"), 1, TOTAL, backend="pytorch_ddp")[0]


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    return sharded_story.first_halves(tmp_path_factory)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    return sharded_story.resumes(tmp_path_factory)


@pytest.fixture(scope="module")
def saved_on_two_ranks(first):
    """The checkpoint of HALF updates on 2 ranks (never written to: copy it to change it), and its losses."""
    return first["dirs"]["two"], first["results"]["two"][0]


def test_sharded_checkpoint_layout(saved_on_two_ranks):
    save, _ = saved_on_two_ranks
    last = save / "checkpoint_last"
    assert last.is_symlink() and (last / "COMPLETE").exists()
    shards = sorted(p.name for p in last.iterdir() if p.suffix == ".distcp")
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shards
    assert not [p for p in save.iterdir() if p.name.startswith(".") and p.name != LOCK_NAME]  # no partial dirs


@pytest.mark.parametrize("world_size", [2, 1, 3])
def test_resume_on_any_number_of_ranks_continues_exactly(world_size, data_bin, reference, saved_on_two_ranks,
                                                         tmp_path, tmp_path_factory):
    save, first_half = saved_on_two_ranks
    np.testing.assert_allclose(first_half, reference[:HALF], rtol=1e-5)
    if world_size == 2:  # in the shared spawn of resumes
        second_half = sharded_story.resumes(tmp_path_factory)["two"]
    else:
        second_half = run(data_bin, sharded_story.copy(save, tmp_path / "ck"), world_size, TOTAL)[0]
    np.testing.assert_allclose(second_half, reference[HALF:], rtol=1e-5)


def test_one_rank_checkpoint_resumes_on_two(first, resumed, reference):
    assert first["one_rank_is_sharded"]
    np.testing.assert_allclose(resumed["one"], reference[HALF:], rtol=1e-5)


def test_two_rank_resume_is_exact_with_dropout(first, resumed):
    """Every rank's RNG stream is saved and restored, so dropout masks continue too."""
    straight, split = first["results"]["straight"][0], first["results"]["split"][0]
    assert split + resumed["split"] == straight  # bit-identical


def test_async_save_resumes_exactly(first, resumed, reference):
    """--async-save (saving after every update, in the background) keeps resume exact and atomic."""
    # --keep-interval-updates 2 pruned the older directories; checkpoint_last points to the newest
    assert [name for name in first["async_names"] if name != LOCK_NAME] == [
        "checkpoint_1_3", "checkpoint_1_4", "checkpoint_last", "config.yaml"]
    assert first["async_last"] == "checkpoint_1_4"
    np.testing.assert_allclose(resumed["async"], reference[HALF:], rtol=1e-5)


def test_every_form_resumes_under_another_backend(first, resumed, reference):
    # sharded (fully_sharded) -> pytorch_ddp
    np.testing.assert_allclose(resumed["sharded_to_ddp"], reference[HALF:], rtol=1e-5)
    # single file (pytorch_ddp) -> fully_sharded
    assert first["single_is_file"]
    np.testing.assert_allclose(resumed["single_to_sharded"], reference[HALF:], rtol=1e-5)


def test_missing_shard_is_a_clear_error(data_bin, saved_on_two_ranks, tmp_path, capsys):
    from shardtrain.cli import train

    broken = sharded_story.copy(saved_on_two_ranks[0], tmp_path / "ck")
    os.remove(broken / "checkpoint_last" / "__1_0.distcp")
    with pytest.raises(SystemExit) as info:
        train.main([data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
                    "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
                    "--batch-size", "4", "--optimizer", "sgd", "--momentum", "0.9", "--lr-scheduler", "fixed",
                    "--ddp-backend", "fully_sharded", "--cpu", "--save-dir", str(broken), "--max-update", "6"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "shard file is missing or damaged" in err and "Traceback" not in err


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


def test_sharded_checkpoint_of_another_architecture_is_refused(data_bin, saved_on_two_ranks, tmp_path, capsys):
    from shardtrain.cli import train

    copy = sharded_story.copy(saved_on_two_ranks[0], tmp_path / "ck")
    before = sorted(p.name for p in copy.iterdir())
    with pytest.raises(SystemExit) as info:
        train.main([data_bin, "--arch", "transformer_lm", "--decoder-layers", "3", "--decoder-embed-dim", "16",
                    "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
                    "--batch-size", "4", "--ddp-backend", "fully_sharded", "--cpu", "--save-dir", str(copy),
                    "--max-update", "6"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "saved with another model" in err and "Traceback" not in err
    assert sorted(p.name for p in copy.iterdir()) == before
