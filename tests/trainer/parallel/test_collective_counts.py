"""The gradient collectives each backend issues per update, micro-batch by micro-batch
(4 real gloo ranks on CPU, one spawn for every case).

"No communication on accumulation steps" (pytorch_ddp, legacy_ddp, and fully_sharded
with --fsdp-unsharded-accumulation) and "reduce-scatter on every micro-batch" (the
fully_sharded default, which keeps gradients sharded) are claims about communication,
so they are counted: ``CommDebugMode`` around each micro-batch's backward and around
``Backend.reduce_grads`` (see collective_mains.py). 4 ranks, so that hybrid_* runs on a
real 2 x 2 mesh (2 replicas of 2 shards). Every variant must also train the same.
"""
import functools

import numpy as np
import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from collective_mains import count_variants
from st_testutils import make_space_data_bin

TESTS_ROOM = "shardtrain.trainer.parallel"  # it drives the commands: its imports cannot say which room it tests

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]

LAYERS, UPDATES, UPDATE_FREQS = 2, 2, (1, 3)
UNITS = LAYERS + 1  # fully_sharded: one FSDP unit per block, then the root
GRADIENT_KINDS = ("all_reduce", "reduce_scatter")

HYBRID = {"ddp_backend": "fully_sharded", "shard_group_size": 2}
BACKENDS = {
    "pytorch_ddp": {"ddp_backend": "pytorch_ddp"},
    "legacy_ddp": {"ddp_backend": "legacy_ddp"},
    "fully_sharded": {"ddp_backend": "fully_sharded"},
    "fully_sharded+unsharded": {"ddp_backend": "fully_sharded", "fsdp_unsharded_accumulation": True},
    "hybrid_shard": {**HYBRID, "fsdp_sharding_strategy": "hybrid_shard"},
    "hybrid_shard_zero2": {**HYBRID, "fsdp_sharding_strategy": "hybrid_shard_zero2"},
    "hybrid_shard+unsharded": {**HYBRID, "fsdp_sharding_strategy": "hybrid_shard",
                               "fsdp_unsharded_accumulation": True},
}
RS, AR = {"reduce_scatter": UNITS}, {"all_reduce": UNITS}
# backend -> gradient collectives in (an accumulation micro-batch's backward, the last one's, reduce_grads)
EXPECTED = {
    "pytorch_ddp": ({}, {"all_reduce": 1}, {}),  # one bucket: the model is far below --bucket-cap-mb
    "legacy_ddp": ({}, {}, {"all_reduce": 1}),  # one flat all-reduce after the last backward
    "fully_sharded": (RS, RS, {}),  # gradients stay sharded: every micro-batch reduce-scatters
    "fully_sharded+unsharded": ({}, RS, {}),
    "hybrid_shard": (RS, {**RS, **AR}, {}),  # only the cross-replica all-reduce waits for the last
    "hybrid_shard_zero2": (RS, {**RS, **AR}, {}),
    "hybrid_shard+unsharded": ({}, {**RS, **AR}, {}),
}


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collectives")
    data_bin = make_space_data_bin(str(tmp), n_words=8, train_tokens=1900, valid_tokens=200, line_len=40)
    cfg = parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", str(LAYERS), "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--required-batch-size-multiple", "1", "--dropout", "0", "--optimizer", "sgd",
        "--momentum", "0.9", "--lr", "0.5", "--max-update", str(UPDATES), "--no-save", "--disable-validation",
        "--cpu", "--threads", "1", "--log-format", "none", "--save-dir", str(tmp / "unused"),
        "--distributed-world-size", "4", "--heartbeat-timeout", "60"])
    variants = {(name, freq): {"distributed": overrides, "optimization": {"update_freq": freq}}
                for name, overrides in BACKENDS.items() for freq in UPDATE_FREQS}
    return call_main(cfg, functools.partial(count_variants, variants=variants))


def gradient_collectives(phase: dict) -> dict:
    # FSDP also all-gathers resharded parameters in backward: parameter traffic, not gradients
    assert set(phase) <= {*GRADIENT_KINDS, "all_gather"}, phase
    return {kind: n for kind, n in phase.items() if kind in GRADIENT_KINDS}


@pytest.mark.flag_effect("--ddp-backend", "--fsdp-unsharded-accumulation", "--fsdp-sharding-strategy", "--shard-group-size")
@pytest.mark.parametrize("update_freq", UPDATE_FREQS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_collectives_per_micro_batch(counts, backend, update_freq):
    accumulating, last, reduce_grads = EXPECTED[backend]
    expected = {**{f"backward {i}": accumulating for i in range(update_freq - 1)},
                f"backward {update_freq - 1}": last, "reduce_grads": reduce_grads}
    result = counts[backend, update_freq]
    assert result["fsdp_units"] == (UNITS if BACKENDS[backend]["ddp_backend"] == "fully_sharded" else 0)
    updates = result["collectives"]
    assert len(updates) == UPDATES
    for update in updates:  # the first (FSDP's lazy init) and a steady one
        assert {phase: gradient_collectives(kinds) for phase, kinds in update.items()} == expected


@pytest.mark.parametrize("update_freq", UPDATE_FREQS)
def test_every_variant_trains_the_same(counts, update_freq):
    reference = counts["pytorch_ddp", update_freq]
    assert np.all(np.isfinite(reference["losses"]))
    for backend in BACKENDS:
        result = counts[backend, update_freq]
        np.testing.assert_allclose(result["losses"], reference["losses"], rtol=1e-5, err_msg=backend)
        assert result["weights"].keys() == reference["weights"].keys()
        for key, value in result["weights"].items():
            np.testing.assert_allclose(value, reference["weights"][key], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{backend}: {key}")
