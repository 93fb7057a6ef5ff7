"""A checkpoint resumed under another precision (the pairs users combine: a run moved to fp16 for speed, or off
it after overflows): it resumes, from the saved update, with the new precision's own state -- a loss scaler
starting at --fp16-init-scale where the checkpoint had none, no loss scale where the new precision has none.
Both checkpoint forms: sharded (fully_sharded, DCP, which refuses a key the checkpoint lacks unless told) and
a single file (pytorch_ddp). Issue 45: a mutation run said no test resumed across precisions."""
import pytest

from shardtrain.cli import train
from st_testutils import json_records, last_checkpoint_state, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.checkpoint"  # it drives training runs: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # training runs, in this process
FLAGS = {"fp32": [], "bf16": ["--bf16"], "fp16": ["--fp16", "--fp16-init-scale", "64"]}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("precision_resume")))


def _train(data_bin, save_dir, precision, backend, updates):
    log = f"{save_dir}.{precision}.log"
    train.main([data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", backend, "--save-dir", str(save_dir),
                "--log-file", log, "--max-update", str(updates), "--disable-validation", "--lr", "0.001",
                *FLAGS[precision]])
    return json_records(log, "train_inner")


@pytest.mark.parametrize("saved, resumed, backend", [
    ("fp32", "fp16", "fully_sharded"), ("bf16", "fp16", "fully_sharded"), ("fp16", "bf16", "fully_sharded"),
    ("fp16", "fp32", "fully_sharded"), ("fp32", "fp16", "pytorch_ddp"), ("fp16", "fp32", "pytorch_ddp")])
def test_a_checkpoint_resumes_under_another_precision_with_that_precisions_state(data_bin, tmp_path, saved,
                                                                                  resumed, backend):
    save_dir = tmp_path / "save"
    first = _train(data_bin, save_dir, saved, backend, 2)
    assert [r["num_updates"] for r in first] == [1, 2]
    assert ("loss_scale" in first[0]) == (saved == "fp16")
    second = _train(data_bin, save_dir, resumed, backend, 4)
    assert [r["num_updates"] for r in second] == [3, 4]  # from the saved update, not from scratch
    if resumed == "fp16":
        assert [r["loss_scale"] for r in second] == [64.0, 64.0]  # its own scaler, from --fp16-init-scale
    else:
        assert all("loss_scale" not in r for r in second)
    state = last_checkpoint_state(save_dir)
    assert state["train_state"]["num_updates"] == 4
    # the new precision's state only: a fresh scaler that has seen the 2 resumed updates, or none at all
    assert state["precision"] == ({"loss_scaler": {"loss_scale": 64.0, "iter": 2, "last_overflow_iter": -1,
                                                   "last_rescale_iter": -1, "overflows_since_rescale": 0}}
                                  if resumed == "fp16" else {})
