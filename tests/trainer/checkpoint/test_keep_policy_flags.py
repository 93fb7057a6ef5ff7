"""Keep policies and save schedules at non-default values, in both checkpoint formats, against the
names fairseq 0.12.2 writes and prunes (fairseq/checkpoint_utils.py save_checkpoint, fairseq_cli/
train.py validate_and_save). Epoch E ends at update 3 * E (schedule_runs.py).

The expected names are written out per format: a single file per name (pytorch_ddp), or one sharded
directory per saved update, ``checkpoint_{epoch}_{updates}``, with the other names as links to it
(fully_sharded). A directory no name points to any more is removed with its last name."""
import pytest

from schedule_runs import UPDATES_PER_EPOCH, link_targets, run, short_epochs_data_bin

TESTS_ROOM = "shardtrain.trainer.checkpoint"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

FORMATS = ["pytorch_ddp", "fully_sharded"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return short_epochs_data_bin(str(tmp_path_factory.mktemp("data")))


@pytest.mark.flag_effect("--keep-last-epochs", "--keep-interval-updates", "--save-interval-updates",
                         "--disable-validation")
@pytest.mark.parametrize("backend", FORMATS)
def test_keep_last_epochs_and_interval_updates(data_bin, tmp_path, backend):
    # 9 updates; interval saves at 2, 4 and 8 (6 ends epoch 2: an epoch save, as in fairseq)
    out = run(data_bin, tmp_path, "keep", "--max-epoch", "3", "--save-interval-updates", "2",
              "--keep-interval-updates", "1", "--keep-last-epochs", "1", "--disable-validation", backend=backend)
    assert out["epoch_ends"] == [3, 6, 9] and UPDATES_PER_EPOCH == 3
    assert out["saved"] == [2, 3, 4, 6, 8, 9]
    assert out["validated"] == []  # --disable-validation: and so no checkpoint_best either
    if backend == "pytorch_ddp":
        assert out["names"] == {"checkpoint3.pt", "checkpoint_3_8.pt", "checkpoint_last.pt"}
    else:
        assert out["names"] == {"checkpoint3", "checkpoint_3_8", "checkpoint_3_9", "checkpoint_last"}
        assert link_targets(out["save_dir"]) == {"checkpoint3": "checkpoint_3_9", "checkpoint_last": "checkpoint_3_9"}


@pytest.mark.flag_effect("--no-epoch-checkpoints", "--no-last-checkpoints", "--save-interval-updates")
@pytest.mark.parametrize("backend", FORMATS)
def test_no_epoch_and_no_last_checkpoints_keep_the_interval_ones(data_bin, tmp_path, backend):
    # fairseq writes checkpoint_{epoch}_{updates} whatever --no-epoch-checkpoints says (its recipes pair it
    # with --save-interval-updates and --keep-interval-updates); the ends of epochs name nothing to save
    out = run(data_bin, tmp_path, "nolast", "--max-epoch", "2", "--save-interval-updates", "2",
              "--no-epoch-checkpoints", "--no-last-checkpoints", "--disable-validation", backend=backend)
    assert out["epoch_ends"] == [3, 6]
    assert out["saved"] == [2, 4]
    if backend == "pytorch_ddp":
        assert out["names"] == {"checkpoint_1_2.pt", "checkpoint_2_4.pt"}
    else:
        assert out["names"] == {"checkpoint_1_2", "checkpoint_2_4"}
        assert link_targets(out["save_dir"]) == {}


@pytest.mark.flag_effect("--save-interval", "--validate-interval")
@pytest.mark.parametrize("backend", FORMATS)
def test_save_interval_saves_every_second_epoch(data_bin, tmp_path, backend):
    # epoch 3 is neither saved (3 % 2) nor, with no save, left in checkpoint_last: fairseq does the same
    out = run(data_bin, tmp_path, "every2", "--max-epoch", "3", "--save-interval", "2", "--validate-interval", "3",
              backend=backend)
    assert out["epoch_ends"] == [3, 6, 9]
    assert out["saved"] == [6]
    assert out["validated"] == [9]  # so no checkpoint_best: the one validation came with no save
    if backend == "pytorch_ddp":
        assert out["names"] == {"checkpoint2.pt", "checkpoint_last.pt"}
    else:
        assert out["names"] == {"checkpoint2", "checkpoint_2_6", "checkpoint_last"}
        assert link_targets(out["save_dir"]) == {"checkpoint2": "checkpoint_2_6", "checkpoint_last": "checkpoint_2_6"}


@pytest.mark.flag_effect("--keep-best-checkpoints", "--keep-interval-updates", "--no-epoch-checkpoints")
@pytest.mark.parametrize("backend,extra", [("pytorch_ddp", ()), ("fully_sharded", ()),
                                           ("fully_sharded", ("--async-save",))],
                         ids=["pytorch_ddp", "fully_sharded", "fully_sharded-async"])
def test_keep_best_leaves_nothing_the_policies_drop(data_bin, tmp_path, backend, extra):
    # saves at 2 (interval), 3 (end of epoch 1: best and last only) and 4 (the stop, interval), each a new
    # best: the names of 3 are all taken by 4, so a sharded checkpoint_1_3 must go with them, and the best
    # kept is 4's alone, also when it is linked in the background (--async-save)
    out = run(data_bin, tmp_path, "best", "--max-update", "4", "--save-interval-updates", "2",
              "--keep-interval-updates", "1", "--keep-best-checkpoints", "1", "--no-epoch-checkpoints",
              *extra, backend=backend)
    assert out["saved"] == out["validated"] == [2, 3, 4]
    losses = out["valid_losses"]
    assert losses == sorted(losses, reverse=True) and len(set(losses)) == 3  # every validation a new best
    best = f"checkpoint.best_loss_{losses[-1]:.3f}0"  # the digit is in [0, 1)
    if backend == "pytorch_ddp":
        assert out["names"] == {"checkpoint_2_4.pt", "checkpoint_best.pt", best + ".pt", "checkpoint_last.pt"}
    else:
        assert out["names"] == {"checkpoint_2_4", "checkpoint_best", best, "checkpoint_last"}
        assert link_targets(out["save_dir"]) == {n: "checkpoint_2_4" for n in ("checkpoint_best", best,
                                                                                "checkpoint_last")}


@pytest.mark.flag_effect("--no-save")
def test_no_save_writes_nothing(data_bin, tmp_path):
    out = run(data_bin, tmp_path, "nosave", "--max-update", "4", "--no-save", backend="fully_sharded")
    assert out["validated"] == [3, 4]  # the end of epoch 1, and the stop: the saves' validations still run
    assert out["saved"] == [] and out["names"] is None  # not even the save dir (nor its lock) is made
