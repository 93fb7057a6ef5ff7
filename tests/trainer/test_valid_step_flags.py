"""--max-valid-steps and --fixed-validation-seed (fairseq 0.12.2 DatasetConfig; fairseq_cli/train.py
validate()). --max-valid-steps N validates on the first N batches of each subset (fairseq's loop reads
one batch more, i > N; the help says "how many batches", which is what we do). --fixed-validation-seed
seeds validation without disturbing training's random state."""
import pytest

from shardtrain.cli import train
from st_testutils import cli_refusal, json_records, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.validation"  # it drives the commands: its imports cannot say which room it tests


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("data")), valid_tokens=1200)


def _run(data_bin, tmp_path, name, *extra):
    log = str(tmp_path / f"{name}.log")
    train.main([data_bin, *tiny_model_flags(), "--max-update", "3", "--no-save", "--log-file", log,
                "--validate-interval-updates", "1", "--dropout", "0.3", "--seed", "7", *extra])
    return json_records(log, "train_inner"), json_records(log, "valid")


@pytest.mark.slow
@pytest.mark.flag_effect("--max-valid-steps")
def test_max_valid_steps_limits_the_batches(data_bin, tmp_path):
    _, full = _run(data_bin, tmp_path, "full")
    _, one = _run(data_bin, tmp_path, "one", "--max-valid-steps", "1")
    _, many = _run(data_bin, tmp_path, "many", "--max-valid-steps", "1000")
    full_losses = [r["valid_loss"] for r in full]
    assert [r["valid_loss"] for r in many] == full_losses
    assert all(a != b for a, b in zip([r["valid_loss"] for r in one], full_losses))


@pytest.mark.slow
def test_fixed_validation_seed_leaves_training_randomness_alone(data_bin, tmp_path):
    plain, _ = _run(data_bin, tmp_path, "plain")
    seeded, _ = _run(data_bin, tmp_path, "seeded", "--fixed-validation-seed", "123")
    assert len(plain) == 3
    assert [r["loss"] for r in seeded] == [r["loss"] for r in plain]


def test_max_valid_steps_must_be_positive(data_bin, capsys):
    _, err = cli_refusal(train.main, [data_bin, *tiny_model_flags(), "--max-valid-steps", "0"], capsys)
    assert "--max-valid-steps must be positive" in err
