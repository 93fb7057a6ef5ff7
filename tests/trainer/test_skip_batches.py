"""--skip-batches (shardtrain/data/batch_windows.py, trainer/loop.py): exactly the batches a window names
are passed over, with --update-freq above 1 too (an update a window covers in part trains on the rest),
and windows that match no batch, or an epoch left with nothing to train, are named in a warning."""
import functools
import logging

import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.data.batch_windows import BatchWindows, format_batches
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.loop import Run, train
from st_testutils import make_space_data_bin, tiny_model_flags

FLAGS = ["--lr", "0.01", "--lr-scheduler", "fixed", "--no-save", "--disable-validation", "--log-format", "none"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    # 2,000 tokens (2,100 with the line ends): 9 batches of 8 x 32 tokens an epoch
    return make_space_data_bin(str(tmp_path_factory.mktemp("skip")), n_words=8, train_tokens=2000)


def consumed(cfg, ctx):
    """Train; -> (per update, the sample ids of each batch it trained on; updates done)."""
    run = Run(cfg, ctx)
    step, updates = run.trainer.train_step, []

    def recording_step(samples):
        updates.append([sample["id"].tolist() for sample in samples])
        return step(samples)

    run.trainer.train_step = recording_step
    try:
        train(run)
    finally:
        run.close()
    return updates, run.trainer.num_updates


def run(data_bin, tmp_path, *flags):
    args = [data_bin, *tiny_model_flags(), *FLAGS, "--save-dir", str(tmp_path / "ck"), *flags]
    return call_main(parse_train_args(args), consumed)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--skip-batches", "--update-freq")
def test_update_freq_2_passes_over_exactly_the_batches_named(data_bin, tmp_path):
    """One epoch of 9 batches, --update-freq 2, --skip-batches 1:3-5: the update of batches 3-4 is skipped
    whole; the next trains on batch 6 alone (its batch 5 is named); then 7-8, and 9 (the epoch's last)."""
    plain, _ = run(data_bin, tmp_path, "--update-freq", "2", "--max-epoch", "1")
    batch = [None] + [b for update in plain for b in update]  # batch[i]: the sample ids of batch i
    assert [len(update) for update in plain] == [2, 2, 2, 2, 1] and len({str(b) for b in batch}) == 10
    got, updates = run(data_bin, tmp_path, "--update-freq", "2", "--max-epoch", "1", "--skip-batches", "1:3-5")
    assert got == [[batch[1], batch[2]], [batch[6]], [batch[7], batch[8]], [batch[9]]] and updates == 4


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--skip-batches")
def test_a_window_past_the_epochs_end_is_named(data_bin, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="shardtrain.trainer.loop"):
        got, updates = run(data_bin, tmp_path, "--max-epoch", "1", "--skip-batches", "1:2-2,1:10-11")
    assert updates == 8 and len(got) == 8  # batch 2 passed over, of 9
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert messages == ["--skip-batches 1:10-11 matched no batch: epoch 1 has 9 batches on each rank (counted from 1 "
                        "within the epoch), so nothing was skipped for it. Check the window's epoch and numbers."]


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--skip-batches", "--max-epoch")
def test_an_epoch_skipped_whole_and_a_window_never_reached_are_named(data_bin, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="shardtrain.trainer.loop"):
        got, updates = run(data_bin, tmp_path, "--max-epoch", "2", "--skip-batches", "2:1-9,3:1-1")
    assert updates == 9 and len(got) == 9  # epoch 1 only
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert messages == [
        "epoch 2 trained nothing: --skip-batches 2:1-9 passed over every one of its 9 batches this run reached "
        "(on each rank).",
        "--skip-batches 3:1-1 matched no batch: training stopped at update 9 before reaching them, so nothing was "
        "skipped for them."]


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--skip-batches", "--max-update")
def test_a_window_after_where_training_stopped_is_named_as_not_reached(data_bin, tmp_path, caplog):
    """Stopped at update 3, in epoch 1: a window later in that epoch was not reached (not "past its end")."""
    with caplog.at_level(logging.WARNING, logger="shardtrain.trainer.loop"):
        got, updates = run(data_bin, tmp_path, "--max-update", "3", "--skip-batches", "1:8-8")
    assert updates == 3 and len(got) == 3
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "--skip-batches 1:8-8 matched no batch: training stopped at update 3 before reaching them, so nothing was "
        "skipped for them."]


def test_the_windows_decisions():
    windows = BatchWindows([(1, 3, 5), (1, 9, 9), (2, 1, 2), (2, 40, 50)])
    windows.begin_epoch(1, 0)
    assert [windows.skip(1, a, a + 1) for a in (1, 3, 5, 7)] == [[], [3, 4], [5], []]
    assert windows.end_epoch(1, 8) == ["--skip-batches 1:9-9 matched no batch: epoch 1 has 8 batches on each rank "
                                       "(counted from 1 within the epoch), so nothing was skipped for it. Check the "
                                       "window's epoch and numbers."]
    windows.begin_epoch(2, 2)  # resumed after batch 2: the window 2:1-2 lay before it and is no warning
    assert windows.skip(2, 3, 4) == [] and windows.skip(2, 5, 5) == []
    assert windows.end_epoch(2, 5)[0].startswith("--skip-batches 2:40-50 matched no batch: epoch 2 has 5 batches")
    assert windows.end_run(9) == []  # every window matched or was named
    assert format_batches([3, 4, 5, 9, 11, 12]) == "3-5,9,11-12"


def test_an_epoch_all_skipped_counts_only_the_batches_this_run_reached():
    windows = BatchWindows([(1, 4, 6)])
    windows.begin_epoch(1, 3)  # resumed after batch 3 of 6
    assert windows.skip(1, 4, 5) == [4, 5] and windows.skip(1, 6, 6) == [6]
    assert windows.end_epoch(1, 6) == ["epoch 1 trained nothing: --skip-batches 1:4-6 passed over every one of its "
                                       "3 batches this run reached (on each rank)."]
