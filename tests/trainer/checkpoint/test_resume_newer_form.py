"""A save dir that holds checkpoint_last in both forms (checkpoint_last.pt from a single-file backend, the
sharded directory checkpoint_last from fully_sharded) resumes from the one with more updates, whichever backend
wrote last, and says so; at the same update, from the form the run's backend writes (see newer.py)."""
import logging

import pytest

from shardtrain.cli import consolidate, train
from shardtrain.trainer.checkpoint.newer import pick
from st_testutils import make_space_data_bin, tiny_model_flags

pytestmark = [pytest.mark.flag_effect("--ddp-backend")]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("newer")), n_words=6, train_tokens=3000,
                               valid_tokens=300, line_len=30, seed=3)


def resume(data_bin, save, backend, max_update, caplog):
    """Train with ``backend`` to ``max_update``; -> (the 'loaded checkpoint' line, the both-forms warning)."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        train.main([data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", backend, "--max-update",
                    str(max_update), "--save-dir", str(save), "--log-format", "none"])
    lines = [r.getMessage() for r in caplog.records]
    loaded = [m for m in lines if m.startswith("loaded checkpoint")]
    both = [m for m in lines if "in both forms" in m]
    return (loaded[0] if loaded else None), (both[0] if both else None)


@pytest.mark.slow
def test_the_form_with_more_updates_wins_in_both_orders(data_bin, tmp_path, caplog):
    save = tmp_path / "save"
    resume(data_bin, save, "pytorch_ddp", 2, caplog)  # checkpoint_last.pt @ 2
    loaded, both = resume(data_bin, save, "fully_sharded", 4, caplog)  # only the file yet: resumes from it
    assert loaded.startswith(f"loaded checkpoint {save}/checkpoint_last.pt (epoch 1 @ 2 updates)") and both is None
    # the sharded checkpoint_last (4) is newer than the file (2) the single-file backend left
    loaded, both = resume(data_bin, save, "pytorch_ddp", 6, caplog)
    assert loaded.startswith(f"loaded checkpoint {save}/checkpoint_last (epoch 1 @ 4 updates)"), loaded
    assert f"Resuming from {save}/checkpoint_last: it records more updates (4 against 2)" in both, both
    # now the file (6) is newer than the directory (4)
    loaded, both = resume(data_bin, save, "fully_sharded", 8, caplog)
    assert loaded.startswith(f"loaded checkpoint {save}/checkpoint_last.pt (epoch 1 @ 6 updates)"), loaded
    assert f"Resuming from {save}/checkpoint_last.pt: it records more updates (6 against 4)" in both, both


@pytest.mark.slow
def test_at_the_same_update_the_form_the_backend_writes_wins(data_bin, tmp_path, caplog):
    save = tmp_path / "save"
    resume(data_bin, save, "fully_sharded", 2, caplog)
    consolidate.main([str(save / "checkpoint_last"), str(save / "checkpoint_last.pt")])  # the same update
    for backend, chosen in (("fully_sharded", "checkpoint_last"), ("pytorch_ddp", "checkpoint_last.pt")):
        loaded, both = resume(data_bin, save, backend, 2, caplog)
        assert loaded.startswith(f"loaded checkpoint {save}/{chosen} (epoch 1 @ 2 updates)"), (backend, loaded)
        assert "both record update 2" in both, both


def test_the_rule_on_update_counts_and_times():
    # (updates, time written) of the file, then of the directory; True: the directory wins
    assert pick((2, 200.0), (4, 100.0), prefer_directory=False) == (True, "it records more updates (4 against 2)")
    assert pick((7, 100.0), (4, 200.0), prefer_directory=True)[0] is False
    assert pick((4, 100.0), (4, 200.0), prefer_directory=False)[0] is False  # same update: the run's form
    assert pick((4, 200.0), (4, 100.0), prefer_directory=True)[0] is True
    # an unreadable count: the one written last
    assert pick((None, 100.0), (4, 200.0), prefer_directory=False)[0] is True
    assert pick((9, 300.0), (None, 200.0), prefer_directory=True)[0] is False
