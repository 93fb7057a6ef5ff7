"""Adaptive input/softmax and --decoder-layerdrop under every backend (2 real gloo ranks, one spawn).

Adaptive runs are compared with one process seeing the same global batch (--update-freq 2);
SGD with momentum and no clipping, so a gradient of the wrong scale or a missing one shows.
Layerdrop runs cannot equal one process (the skip draws advance per forward, so one process
with --update-freq 2 draws twice per update where each rank draws once); they must run every
update under each backend (pytorch_ddp without --find-unused-parameters) and every rank must
drop the same blocks on every forward, so each update trains one sub-network.
"""
import functools

import numpy as np
import pytest

from shardtrain.trainer.launch.start import call_main
from adaptive_mains import train_and_report
from optim_mains import run_each
from test_backend_equivalence import config as equivalence_config
from st_testutils import make_space_data_bin

TESTS_ROOM = "shardtrain.trainer.parallel"  # it drives the commands: its imports cannot say which room it tests

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]

UPDATES = 12
ADAPTIVE = ["--adaptive-input", "--adaptive-input-cutoff", "6,12", "--adaptive-softmax-cutoff", "6,12",
            "--tie-adaptive-weights", "--tie-adaptive-proj", "--criterion", "adaptive_loss"]
LAYERDROP = ["--decoder-layerdrop", "0.5", "--decoder-layers", "4"]
TWO_RANKS = {
    "adaptive pytorch_ddp": ["--ddp-backend", "pytorch_ddp", *ADAPTIVE],
    "adaptive fully_sharded": ["--ddp-backend", "fully_sharded", *ADAPTIVE],
    "layerdrop pytorch_ddp": ["--ddp-backend", "pytorch_ddp", *LAYERDROP],
    "layerdrop legacy_ddp": ["--ddp-backend", "legacy_ddp", *LAYERDROP],
    "layerdrop fully_sharded": ["--ddp-backend", "fully_sharded", *LAYERDROP, *ADAPTIVE],
}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("adaptive")), n_words=20, train_tokens=1900,
                               valid_tokens=200, line_len=40)


def config(data_bin, tmp_path, world_size, *extra):
    """The backend-equivalence runs' settings (SGD with momentum, unclipped), for UPDATES updates."""
    return equivalence_config(data_bin, tmp_path, world_size, "--max-update", str(UPDATES), *extra)


@pytest.fixture(scope="module")
def runs(data_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranks")
    jobs = [(train_and_report, config(data_bin, tmp, 2, *flags)) for flags in TWO_RANKS.values()]
    two = dict(zip(TWO_RANKS, call_main(jobs[0][1], functools.partial(run_each, jobs))))
    single = call_main(config(data_bin, tmp, 1, "--update-freq", "2", *ADAPTIVE), train_and_report)
    return two, single


@pytest.mark.parametrize("backend", ["pytorch_ddp", "fully_sharded"])
def test_adaptive_two_ranks_equal_one_process(backend, runs):
    two, single = runs
    result = two[f"adaptive {backend}"]
    np.testing.assert_allclose(result["losses"], single["losses"], rtol=1e-5)
    assert np.mean(single["losses"][-3:]) < np.mean(single["losses"][:3])  # it trains
    assert result["weights"].keys() == single["weights"].keys()
    for name, value in single["weights"].items():
        np.testing.assert_allclose(result["weights"][name], value, rtol=1e-5, atol=1e-5, err_msg=name)
    moved = "embed_tokens.embeddings.2.0.weight"  # a tied band, trained through input and softmax
    assert name_in(result["weights"], moved)
    expected_share = 0.5 if backend == "fully_sharded" else 1.0
    assert set(result["held"].values()) == {expected_share}, result["held"]  # FSDP2 shards them all


def name_in(weights, name):
    return name in weights and "adaptive_softmax.class_proj.weight" in weights


@pytest.mark.parametrize("name", [n for n in TWO_RANKS if n.startswith("layerdrop")])
def test_layerdrop_ranks_skip_the_same_blocks_and_train(name, runs):
    result = runs[0][name]
    decisions = result["decisions"]
    assert decisions[0] == decisions[1]  # per forward, the same blocks on both ranks
    flat = [kept for forward in decisions[0] for kept in forward]
    assert len(decisions[0]) >= UPDATES and 0 < sum(flat) < len(flat)  # some blocks skipped, some run
    # that the updates train is the adaptive test's claim; here: they ran, on matched ranks, finite
    assert len(result["losses"]) == UPDATES and np.all(np.isfinite(result["losses"]))
