"""--async-save writes the state as it was at save(), never a mix of two updates.

Two real gloo ranks under fully_sharded on the CPU, every shard write held back
1 s, three saves in a row. "split" (the default): parameters and optimizer state
are written from the live tensors, nothing is copied, and the next training
update's optimizer step waits for the write. "copy": staged as on a GPU rank
(a stand-in says every tensor is on a GPU), everything is copied into host
buffers that the first save allocates and the later ones refill (torch 2.11's
stager broke that reuse at the second save), and the live state may change at once. Either way each checkpoint must hold the values at its save().
"""
import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from async_save_mains import save_change_load
from st_testutils import make_space_data_bin

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("async")), n_words=8, train_tokens=4000,
                               valid_tokens=200, line_len=40)


def test_async_save_writes_the_state_at_save(data_bin, tmp_path):
    cfg = parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--optimizer", "adam", "--lr", "0.01", "--max-update", "2",
        "--disable-validation", "--no-save", "--cpu", "--threads", "1", "--log-format", "none",
        "--save-dir", str(tmp_path), "--ddp-backend", "fully_sharded", "--distributed-world-size", "2",
        "--heartbeat-timeout", "60"])
    results = call_main(cfg, save_change_load)
    split, copied = results["split"], results["copy"]
    assert split["differences"] == [0.0] * 3, "a checkpoint holds values of the update after its save() (torn)"
    assert split["waited"] == 3, "the optimizer step after each save must wait for the write"
    assert 0 <= split["copied"] < split["in_place"] / 100, "CPU parameters and moments are written live"
    assert copied["differences"] == [0.0] * 3, "a copied checkpoint holds values changed after save()"
    assert copied["in_place"] == 0 and copied["copied"] == split["in_place"] + split["copied"]
    # every tensor gets one buffer at the first save; the second and third refill the same memory
    sources = copied["sources"]
    assert sources > 10 and copied["allocations"] == [sources] * 3, copied["allocations"]
    first = copied["addresses"][0]
    assert len(first) == sources and copied["addresses"][1] == first == copied["addresses"][2]
    assert split["allocations"][0] == split["allocations"][2] == len(split["addresses"][0]) > 0  # the scalars'
    assert split["addresses"][2] == split["addresses"][0]


def test_the_cpu_step_during_backward_waits_for_the_write_too(data_bin, tmp_path):
    """cpu_adam stepping each shard during backward (trainer/parallel/step_in_backward.py) steps outside
    optimizer.step, whose pre-hook holds steps until the write has landed: its worker waits by itself. One rank,
    in this process (the hold is per process)."""
    cfg = parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--optimizer", "cpu_adam", "--cpu-step", "during-backward", "--lr", "0.01",
        "--max-update", "2", "--disable-validation", "--no-save", "--cpu", "--threads", "1", "--log-format",
        "none", "--save-dir", str(tmp_path), "--ddp-backend", "fully_sharded", "--distributed-world-size", "1"])
    split = call_main(cfg, save_change_load)["split"]
    assert split["differences"] == [0.0] * 3, "a checkpoint holds values stepped during the next backward (torn)"
    assert split["waited"] == 3, "the worker's first step of each update must wait for the write"
