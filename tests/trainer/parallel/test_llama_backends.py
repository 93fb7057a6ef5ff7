"""The ``llama`` family trains under every backend as one process does (real gloo ranks on CPU), as
transformer_lm's test_backend_equivalence.py holds for fairseq's decoder: the same global batch, SGD unclipped
(so a wrong gradient scale reaches the weights), losses, gradient norms and weights within 1e-5. The model is
the hardest shape the family has: grouped-query attention, Qwen3's q/k norms and tied embeddings (one
parameter used twice, which FSDP2 and DDP must reduce once). All 2-rank runs share one spawn."""
import functools

import numpy as np
import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from equivalence_mains import initial_weights, train_and_record_steps
from optim_mains import run_each
from st_testutils import make_space_data_bin

TESTS_ROOM = "shardtrain.trainer.parallel"  # it drives the commands: its imports cannot say which room it tests

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]

UPDATES = 12
FSDP = ["--ddp-backend", "fully_sharded"]
TWO_RANKS = {
    "pytorch_ddp": ["--ddp-backend", "pytorch_ddp"],
    "legacy_ddp": ["--ddp-backend", "legacy_ddp"],
    "fully_sharded": FSDP,
    "fully_sharded checkpointed": FSDP + ["--checkpoint-activations"],
    "fully_sharded shard_grad_op": FSDP + ["--fsdp-sharding-strategy", "shard_grad_op"],
    "pytorch_ddp zero os": ["--ddp-backend", "pytorch_ddp", "--zero-sharding", "os"],
}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("llama_equiv")), n_words=8, train_tokens=1900,
                               valid_tokens=200, line_len=40)


def config(data_bin, tmp_path, world_size, *extra):
    return parse_train_args([
        data_bin, "--arch", "llama3_debug", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "24", "--decoder-attention-heads", "4", "--decoder-kv-heads", "2",
        "--qk-norm", "--share-decoder-input-output-embed", "--tokens-per-sample", "16", "--batch-size", "4",
        "--required-batch-size-multiple", "1",
        "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.2", "--clip-norm", "0",
        "--max-update", str(UPDATES), "--no-save", "--disable-validation",
        "--cpu", "--threads", "1", "--log-format", "none", "--save-dir", str(tmp_path / "unused"),
        "--distributed-world-size", str(world_size), "--heartbeat-timeout", "60", *extra])


@pytest.fixture(scope="module")
def runs(data_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llama_runs")
    single = call_main(config(data_bin, tmp, 1, "--update-freq", "2"), train_and_record_steps)
    start = call_main(config(data_bin, tmp, 1), initial_weights)
    jobs = [(train_and_record_steps, config(data_bin, tmp, 2, *flags)) for flags in TWO_RANKS.values()]
    return single, start, dict(zip(TWO_RANKS, call_main(jobs[0][1], functools.partial(run_each, jobs))))


def test_the_reference_trains_unclipped_and_moves_the_weights(runs):
    single, start, _ = runs
    assert np.mean(single["losses"][-3:]) < np.mean(single["losses"][:3])
    assert max(np.abs(single["weights"][k] - start[k]).max() for k in start) > 1e-2
    assert "blocks.0.self_attn.q_norm.weight" in start and "output_projection.weight" not in start  # the shape


@pytest.mark.parametrize("name", sorted(TWO_RANKS))
def test_two_ranks_equal_one_process(name, runs):
    single, _, two = runs
    result = two[name]
    assert len(result["losses"]) == len(single["losses"]) == UPDATES
    assert not any(result["clipped"] + single["clipped"])
    np.testing.assert_allclose(result["losses"], single["losses"], rtol=1e-5)
    np.testing.assert_allclose(result["gnorms"], single["gnorms"], rtol=1e-5)
    assert result["weights"].keys() == single["weights"].keys()
    for k in single["weights"]:
        np.testing.assert_allclose(result["weights"][k], single["weights"][k], rtol=1e-5, atol=1e-5, err_msg=k)
