"""--compile: each block torch.compiled (one graph shared by all), with the results of eager
training within 1e-5 over 10 updates, dropout on, on one process and on 2 fully_sharded ranks
with activation checkpointing."""
import pytest
import torch

from shardtrain.cli import train
from shardtrain.trainer.checkpoint.consolidate import read_sharded
from st_testutils import json_records, last_checkpoint_state, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.parallel"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

# SGD, not Adam: Adam divides by the root of each gradient's second moment, so a parameter whose true
# gradient is zero (attention's key bias: the softmax ignores a shift shared by all keys) turns rounding
# noise of 1e-10 into lr-sized steps, and any two correct implementations differ there by ~1e-3 after 10
# updates (seen: eager against compiled, all else equal to 1e-7). SGD passes gradients on linearly, so
# the weights measure the compiled numerics themselves.
FLAGS = ["--max-update", "10", "--decoder-layers", "3", "--dropout", "0.1", "--optimizer", "sgd", "--lr", "0.1",
         "--lr-scheduler", "fixed", "--disable-validation", "--no-epoch-checkpoints"]
BACKENDS = {
    "one_process": [],
    "fully_sharded_checkpointed": ["--distributed-world-size", "2", "--ddp-backend", "fully_sharded",
                                   "--checkpoint-activations"],
}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("compile")), n_words=16, train_tokens=4000, seed=5)


def run(data_bin, save_dir, *extra):
    train.main([data_bin, *tiny_model_flags(), *FLAGS, "--save-dir", save_dir, "--log-file", f"{save_dir}.log",
                *extra])
    return last_checkpoint_state(save_dir), json_records(f"{save_dir}.log", "train_inner")


def _weights(state):
    return {k: v for k, v in state.get("model", {}).items() if torch.is_tensor(v)}


@pytest.mark.flag_effect("--compile")
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_compiled_training_equals_eager(data_bin, tmp_path, backend):
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    eager, eager_records = run(data_bin, str(tmp_path / "eager"), *BACKENDS[backend])
    compiled, compiled_records = run(data_bin, str(tmp_path / "compiled"), "--compile", *BACKENDS[backend])
    if not BACKENDS[backend]:  # trained in this process: the 3 blocks share one compiled graph
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    with open(str(tmp_path / "compiled") + ".log") as f:
        assert "torch.compile: 3 blocks" in f.read()
    assert len(compiled_records) == len(eager_records) == 10
    for c, e in zip(compiled_records, eager_records):
        assert c["loss"] == pytest.approx(e["loss"], abs=2e-3)  # the log's 3 decimals
    assert eager_records[-1]["loss"] < eager_records[0]["loss"] - 0.1  # it trained
    if backend == "fully_sharded_checkpointed":  # the weights are in the DCP shards
        eager, compiled = (read_sharded(str(tmp_path / name / "checkpoint_last"), model_only=True)
                           for name in ("eager", "compiled"))
    e, c = _weights(eager), _weights(compiled)
    assert e.keys() == c.keys() and len(e) > 10  # the same names: no wrapper module's prefix
    assert max((e[k] - c[k]).abs().max().item() for k in e) <= 1e-5
