"""The per-rank RNG decisions, without processes (the 2-rank behaviour: tests/trainer/test_rng_per_rank_cpu.py)."""
import logging
import random

import pytest
import torch

from shardtrain.trainer.rng import reseed, rng_for_this_rank, rng_state, set_rng_state


def _draw():
    return torch.rand(3).tolist(), random.random()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU-only process")
@pytest.mark.parametrize("saved_gpu_state", ["one device", "every device (older checkpoints)"])
def test_a_gpu_state_is_skipped_where_no_gpu_is_used(saved_gpu_state, caplog):
    state = rng_state()
    assert "cuda" not in state  # this process never used CUDA
    gpu = torch.arange(16, dtype=torch.uint8)
    state["cuda"] = gpu if saved_gpu_state == "one device" else [gpu, gpu]
    expected = _draw()
    with caplog.at_level(logging.INFO, logger="shardtrain.trainer.rng"):
        set_rng_state(state)
    assert _draw() == expected  # the CPU and Python generators were restored
    assert "GPU random-number state is skipped: this process uses no GPU" in caplog.text


def test_this_ranks_entry_only_at_the_saving_world_size():
    entry = rng_state()
    assert rng_for_this_rank({"rng_per_rank": [entry]}) is entry  # no process group: rank 0 of 1
    assert rng_for_this_rank({"rng_per_rank": [entry, entry]}) is None  # saved by 2 ranks
    assert rng_for_this_rank({"train_state": {"rng": entry}}) is None  # older: rank 0's state only


def test_reseeding_is_deterministic_and_distinct_per_rank_and_update():
    def after(*args):
        reseed(*args)
        return _draw()

    assert after(1, 10, 0) == after(1, 10, 0)
    assert len({str(after(1, 10, 0)), str(after(1, 10, 1)), str(after(1, 11, 0)), str(after(2, 10, 0))}) == 4
