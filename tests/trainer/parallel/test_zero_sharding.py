"""--zero-sharding os on 2 real gloo ranks: the same training as without it, about
half the optimizer state per rank, and checkpoints in the standard name-keyed
format that resume exactly with or without ZeRO, on 2 ranks or 1 process.

The global batch is the same everywhere (ranks x --update-freq = 2 batches per
update). Clipping is off and Adam's eps large (see config), so a gradient of the
wrong scale changes the update, and each update's gradient norm is compared too.
All 2-rank runs share one spawn (zero_mains.record_all).
"""
import numpy as np
import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from st_testutils import make_space_data_bin
from zero_mains import record, record_all

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]

UPDATES, HALF = 10, 5
CHECKPOINT = f"checkpoint_1_{HALF}.pt"  # saved mid-epoch by --save-interval-updates


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("zero")), n_words=8, train_tokens=1900,
                               valid_tokens=200, line_len=40)


def config(data_bin, world_size, save_dir=None, *extra):
    saving = ["--save-dir", str(save_dir), "--save-interval-updates", str(HALF)] if save_dir else ["--no-save"]
    return parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--required-batch-size-multiple", "1", "--dropout", "0",
        # Adam with decoupled weight decay; the lr changes every update (ZeRO passes the wrapper's
        # lr on to the optimizer of each shard). No clipping, and an eps near the gradients' entries
        # (~1e-3): Adam's m/sqrt(v) is otherwise the same for a gradient of any scale, so ZeRO
        # stepping a gradient off by the world size would train the same.
        "--optimizer", "adam", "--adam-eps", "1e-3", "--weight-decay", "0.1", "--lr", "0.01", "--clip-norm", "0",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4",
        "--max-update", str(UPDATES), "--disable-validation", "--cpu", "--threads", "1", "--log-format", "none",
        "--distributed-world-size", str(world_size), "--update-freq", str(2 // world_size),
        "--heartbeat-timeout", "60", *saving, *extra])


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {name: root / name for name in ("one", "plain", "zero", "sharded", "log")}


@pytest.fixture(scope="module")
def one_process(data_bin, dirs):
    """--zero-sharding os in one process: nothing to shard, the plain optimizer."""
    return call_main(config(data_bin, 1, dirs["one"], "--zero-sharding", "os"), record)


@pytest.fixture(scope="module")
def two_ranks(data_bin, dirs, one_process):
    zero = ("--zero-sharding", "os")
    restore = {name: ("--restore-file", str(dirs[name] / CHECKPOINT)) for name in ("one", "plain", "zero", "sharded")}
    cfgs = {
        "plain": config(data_bin, 2, dirs["plain"]),
        "zero": config(data_bin, 2, dirs["zero"], *zero, "--log-file", str(dirs["log"])),
        "zero_legacy": config(data_bin, 2, None, *zero, "--ddp-backend", "legacy_ddp"),
        "zero_from_zero": config(data_bin, 2, None, *zero, *restore["zero"]),
        "plain_from_zero": config(data_bin, 2, None, *restore["zero"]),
        "zero_from_plain": config(data_bin, 2, None, *zero, *restore["plain"]),
        "zero_from_one": config(data_bin, 2, None, *zero, *restore["one"]),
        "fsdp": config(data_bin, 2, dirs["sharded"], "--ddp-backend", "fully_sharded"),
        "zero_from_sharded": config(data_bin, 2, None, *zero, *restore["sharded"]),
    }
    results, error = call_main(cfgs["plain"], record_all(list(cfgs.values())))
    return dict(zip(cfgs, results)), error


def assert_same(result, reference, updates=slice(None)):
    assert not any(result["clipped"] + reference["clipped"])  # the gradient's scale reached every update
    np.testing.assert_allclose(result["losses"], reference["losses"][updates], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(result["gnorms"], reference["gnorms"][updates], rtol=1e-6, atol=1e-6)
    assert result["weights"].keys() == reference["weights"].keys()
    for k, v in result["weights"].items():
        np.testing.assert_allclose(v, reference["weights"][k], rtol=1e-6, atol=1e-6, err_msg=k)


@pytest.mark.flag_effect("--zero-sharding")
def test_sharded_state_trains_as_the_plain_optimizer(two_ranks, one_process, dirs):
    runs, _ = two_ranks
    plain = runs["plain"]
    assert len(plain["losses"]) == UPDATES
    for name in ("zero", "zero_legacy"):
        assert runs[name]["optimizer"] == "ShardedStateOptimizer", name
        assert_same(runs[name], plain)
        assert_same(runs[name], one_process)  # the same global batch in one process
    assert plain["optimizer"] == "AdamW"
    # each rank holds its share of the state (whole tensors: about half), together exactly all of it
    full, shards = plain["optim_bytes"][0], runs["zero"]["optim_bytes"]
    assert plain["optim_bytes"] == [full, full] and sum(shards) == full
    assert all(0.4 * full <= s <= 0.6 * full for s in shards), (shards, full)
    log = dirs["log"].read_text()
    assert "AdamW state sharded over 2 ranks; rank 0 holds the state of" in log


def test_checkpoints_hold_the_whole_name_keyed_state(two_ranks, dirs):
    for name in (CHECKPOINT, "checkpoint_last.pt"):
        zero = torch.load(dirs["zero"] / name, weights_only=True)["optimizer"]
        plain = torch.load(dirs["plain"] / name, weights_only=True)["optimizer"]
        assert zero["param_groups"] == plain["param_groups"]
        assert zero["state"].keys() == plain["state"].keys()
        assert "embed_tokens.weight" in zero["state"]  # keyed by parameter name
        for param, state in plain["state"].items():
            assert state.keys() == zero["state"][param].keys() == {"step", "exp_avg", "exp_avg_sq"}
            for k, v in state.items():
                assert torch.equal(zero["state"][param][k], v), (param, k)


def test_zero_checkpoint_resumes_exactly_on_the_same_ranks(two_ranks):
    runs, _ = two_ranks
    assert_same(runs["zero_from_zero"], runs["zero"], slice(HALF, None))


def test_checkpoints_resume_with_and_without_zero(two_ranks):
    runs, _ = two_ranks
    assert_same(runs["plain_from_zero"], runs["zero"], slice(HALF, None))
    assert_same(runs["zero_from_plain"], runs["zero"], slice(HALF, None))


def test_a_sharded_fully_sharded_checkpoint_resumes_under_zero(two_ranks, dirs):
    """DCP fills a template of the whole state on every rank, then loads it."""
    runs, _ = two_ranks
    assert (dirs["sharded"] / CHECKPOINT[:-3]).is_dir()
    # fully_sharded reduces in another order, so only the losses are compared (Adam turns that
    # round-off into lr-sized steps of the attention key bias, which the loss does not see)
    np.testing.assert_allclose(runs["zero_from_sharded"]["losses"], runs["fsdp"]["losses"][HALF:], rtol=1e-5)


def test_checkpoints_resume_across_world_sizes(two_ranks, one_process, data_bin, dirs):
    runs, _ = two_ranks
    assert one_process["optimizer"] == "AdamW"  # one process keeps the plain optimizer
    assert_same(one_process, runs["plain"])  # the same global batch: the same training
    assert_same(runs["zero_from_one"], one_process, slice(HALF, None))  # 1 process -> 2 ranks
    resumed = call_main(config(data_bin, 1, None, "--zero-sharding", "os", "--restore-file",
                               str(dirs["zero"] / CHECKPOINT)), record)  # 2 ranks -> 1 process
    assert_same(resumed, runs["zero"], slice(HALF, None))


def test_more_ranks_than_parameter_tensors_is_a_clear_error(two_ranks):
    _, error = two_ranks
    assert "only 1 trained tensors for 2 ranks" in error and "Drop --zero-sharding" in error
