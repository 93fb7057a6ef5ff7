"""When validation runs, and the saves it gates, at non-default flag values, against fairseq 0.12.2's
fairseq_cli/train.py validate_and_save and should_stop_early: the updates validated at and saved at
are read from the log and compared with lists written here. Epoch E ends at update 3 * E
(schedule_runs.py); --validate-interval and --disable-validation are in test_keep_policy_flags.py."""
import pytest

from schedule_runs import run, short_epochs_data_bin
from st_testutils import json_records, last_checkpoint_state

TESTS_ROOM = "shardtrain.trainer.checkpoint"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

# Validation batches come shortest first (fairseq orders them by size). The blocks of 32 tokens: valid's
# 128 tokens in lines of 40 (+ eos) make 4 x 32 + 4; test's (the 512 training tokens) 16 x 32 + 13.


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return short_epochs_data_bin(str(tmp_path_factory.mktemp("data")))


@pytest.mark.flag_effect("--validate-after-updates", "--validate-interval-updates", "--max-tokens-valid")
def test_validate_after_updates_holds_back_every_validation(data_bin, tmp_path):
    # the end of epoch 1 (update 3) is held back too; 7 is the stop (--max-update)
    out = run(data_bin, tmp_path, "after", "--max-update", "7", "--validate-after-updates", "4",
              "--validate-interval-updates", "1", "--no-save", "--max-tokens-valid", "96", "--max-valid-steps", "1")
    assert out["epoch_ends"] == [3, 6, 7]
    assert out["validated"] == [4, 5, 6, 7]
    # 96 tokens, padded to the longest: the blocks of 4, 32 and 32 tokens (a 4th makes 4 x 32 > 96)
    assert {(r["valid_bsz"], r["valid_wpb"]) for r in json_records(out["log"], "valid")} == {(3, 68)}


@pytest.mark.flag_effect("--valid-subset", "--batch-size-valid")
def test_every_valid_subset_is_validated_in_batches_of_its_size(data_bin, tmp_path):
    out = run(data_bin, tmp_path, "subsets", "--max-update", "2", "--validate-interval-updates", "1", "--no-save",
              "--valid-subset", "valid,test", "--batch-size-valid", "2", "--max-valid-steps", "1")
    test = json_records(out["log"], "test")
    assert out["validated"] == [int(r["test_num_updates"]) for r in test] == [1, 2]
    assert {(r["valid_bsz"], r["valid_wpb"]) for r in json_records(out["log"], "valid")} == {(2, 4 + 32)}
    assert {(r["test_bsz"], r["test_wpb"]) for r in test} == {(2, 13 + 32)}


@pytest.mark.flag_effect("--validate-after-updates", "--save-interval-updates")
def test_validate_after_updates_holds_back_the_interval_saves(data_bin, tmp_path):
    # fairseq saves an update checkpoint only from --validate-after-updates on (its saves validate); the
    # end of an epoch and the stop are saved (and validated, once past it) whatever it says
    out = run(data_bin, tmp_path, "after-save", "--max-update", "5", "--save-interval-updates", "2",
              "--validate-after-updates", "3")
    assert out["saved"] == [3, 4, 5]
    assert out["validated"] == [3, 4, 5]
    assert {n for n in out["names"] if n.startswith("checkpoint_")} == {"checkpoint_2_4.pt", "checkpoint_best.pt",
                                                                        "checkpoint_last.pt"}
    assert "checkpoint1.pt" in out["names"]


@pytest.mark.flag_effect("--patience", "--validate-interval-updates")
def test_patience_stop_is_saved_and_a_relaunch_trains_no_more(data_bin, tmp_path):
    # a negligible lr keeps the valid loss flat: update 1 sets the best, update 2 does not beat it and, with
    # --patience 1, stops the run; fairseq saves there though no schedule asks for a save at update 2
    flags = ("--max-update", "6", "--lr", "1e-12", "--patience", "1", "--validate-interval-updates", "1")
    out = run(data_bin, tmp_path, "patience", *flags)
    assert out["validated"] == [1, 2] and out["valid_losses"][0] == out["valid_losses"][1]
    assert out["saved"] == [2]
    assert last_checkpoint_state(out["save_dir"])["train_state"]["num_updates"] == 2
    again = run(data_bin, tmp_path, "relaunch", *flags, save_as="patience")  # a requeue of the same command
    assert again["saved"] == again["validated"] == [] and again["epoch_ends"] == []
    assert last_checkpoint_state(out["save_dir"])["train_state"]["num_updates"] == 2


@pytest.mark.flag_effect("--save-interval-updates", "--validate-interval-updates", "--save-interval",
                         "--validate-interval")
def test_an_epoch_with_no_update_is_not_an_interval_save(data_bin, tmp_path):
    # every batch of epoch 1 skipped: it ends at update 0, which fairseq never counts as a multiple of
    # --save-interval-updates / --validate-interval-updates (num_updates > 0); the epoch intervals skip it too
    out = run(data_bin, tmp_path, "zero", "--max-epoch", "2", "--skip-batches", "1:1-3", "--save-interval", "2",
              "--validate-interval", "2", "--save-interval-updates", "2", "--validate-interval-updates", "2")
    assert out["epoch_ends"] == [0, 3]
    assert out["saved"] == [2, 3]
    assert out["validated"] == [2, 3]
    assert out["names"] == {"checkpoint_2_2.pt", "checkpoint2.pt", "checkpoint_best.pt", "checkpoint_last.pt"}
