"""Every rank saves and restores its own random-number generators, in both checkpoint forms.

The ranks' streams differ here, as in real runs: dropout over batches of uneven
shapes consumes different amounts of random numbers on each rank, and each rank
also draws a count of its own from torch and Python's random (rng_mains). A
resume that gave every rank rank 0's generators (single-file checkpoints once
did) changes rank 1's dropout masks and draws, and the bit-identity test fails.
The same runs on GPUs: tests/gpu/test_rng_per_rank.py.
"""
import logging
import random

import pytest
import torch

from rng_mains import (SEED, UPDATES, assert_resumed_bit_identically, config, make_data_bin,
                       straight_and_resumed, train_drawing_per_rank)
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.rng import reseed
from st_testutils import last_checkpoint_state

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("rng")))


@pytest.fixture(scope="module")
def two_ranks(data_bin, tmp_path_factory):
    """(directory, rank 0's log, {form: (straight, resumed)}) of one 2-rank spawn; the
    resumed file carried a GPU generator state on every rank, as a GPU run saves."""
    root = tmp_path_factory.mktemp("two")
    results = straight_and_resumed(data_bin, str(root), 2, fake_gpu_state=True)
    return root, (root / "ranks.log").read_text(), results


@pytest.mark.parametrize("form", ["file", "sharded"])
def test_two_ranks_resume_bit_identically(form, two_ranks):
    """pytorch_ddp (one file from rank 0) and fully_sharded (a directory)."""
    assert_resumed_bit_identically(*two_ranks[2][form], world_size=2)


def test_checkpoints_hold_each_ranks_own_states(two_ranks):
    root = two_ranks[0]
    for form in ("file", "sharded"):
        saved = last_checkpoint_state(root / form)["rng_per_rank"]
        assert len(saved) == 2 and not torch.equal(saved[0]["torch"], saved[1]["torch"]), form
        assert saved[0]["python"] != saved[1]["python"], form
        assert "cuda" not in saved[0], form  # a CPU run saves no GPU state


def test_a_gpu_state_is_skipped_on_a_cpu_run(two_ranks):
    """The file resumed above carried a GPU state: it resumed without error, bit for bit
    (the test above), saying once that the state was skipped."""
    assert two_ranks[1].count("GPU random-number state is skipped: this process uses no GPU") == 1


def _older_checkpoint(path, dst):
    """No rng_per_rank; its train_state's rng held every visible GPU's state."""
    state = torch.load(path, weights_only=True)
    del state["rng_per_rank"]
    state["train_state"]["rng"]["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * 2
    torch.save(state, dst)
    return dst


@pytest.mark.parametrize("case", ["file_on_1", "sharded_on_1", "older_file"])
def test_other_world_size_or_older_checkpoint_reseeds_and_says_so(case, two_ranks, data_bin, tmp_path, caplog):
    file, directory = two_ranks[0] / "file" / "checkpoint_last.pt", two_ranks[0] / "sharded" / "checkpoint_last"
    source = {"file_on_1": file, "sharded_on_1": directory}.get(case) or _older_checkpoint(file, tmp_path / "o.pt")
    caplog.set_level(logging.WARNING, logger="shardtrain.trainer.rng")
    cfg = config(data_bin, tmp_path / "ck", 1, "--ddp-backend", "pytorch_ddp", "--restore-file", str(source),
                 "--max-update", str(UPDATES + 1))
    _, _, draws = call_main(cfg, train_drawing_per_rank)
    why = "predates them" if case == "older_file" else "saved by 2 rank(s) and this run has 1"
    warnings = [r.getMessage() for r in caplog.records if "re-seeded" in r.getMessage()]
    assert len(warnings) == 1 and why in warnings[0], warnings
    # deterministic: seeded from (seed, update, rank); the one update drew these
    reseed(SEED, UPDATES, for_rank=0)  # the hygiene fixture restores the test's own generators
    assert draws[0] == [([torch.rand(1).item()], [random.random()])]
