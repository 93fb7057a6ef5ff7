"""--loss-chunks in real runs: under pytorch_ddp and fully_sharded on 2 gloo ranks, chunked training gives the
unchunked training's losses, gradient norms and weights (transformer_lm with its own output projection, which the
loss uses after forward; llama with tied embeddings, label smoothed). All runs share one spawn. And a chunk count
above a batch's tokens stops shard-train with one paragraph, exit 2."""
import functools

import numpy as np
import pytest

from shardtrain.cli import train
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from chunked_loss_mains import train_counting_chunks
from optim_mains import run_each
from st_testutils import cli_refusal, make_space_data_bin

TESTS_ROOM = "shardtrain.tasks"  # it drives the commands: its imports cannot say which room it tests

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]

UPDATES = 6
FAMILIES = {
    "transformer_lm": ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
                       "--decoder-ffn-embed-dim", "24", "--decoder-attention-heads", "2"],
    "llama": ["--arch", "llama3_debug", "--decoder-layers", "2", "--decoder-embed-dim", "16",
              "--decoder-ffn-embed-dim", "24", "--decoder-attention-heads", "4", "--decoder-kv-heads", "2",
              "--share-decoder-input-output-embed", "--criterion", "label_smoothed_cross_entropy",
              "--label-smoothing", "0.1"],
}
BACKENDS = ("pytorch_ddp", "fully_sharded")
RUNS = [(backend, family, chunks) for backend in BACKENDS for family in FAMILIES for chunks in ("1", "4")]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("chunked")), n_words=8, train_tokens=1900,
                               valid_tokens=200, line_len=40)


def config(data_bin, tmp, *flags):
    return parse_train_args([
        data_bin, *flags, "--tokens-per-sample", "16", "--batch-size", "4", "--required-batch-size-multiple", "1",
        "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.2", "--clip-norm", "0",
        "--max-update", str(UPDATES), "--no-save", "--disable-validation", "--cpu", "--threads", "1",
        "--log-format", "none", "--save-dir", str(tmp / "unused"), "--distributed-world-size", "2",
        "--heartbeat-timeout", "60"])


@pytest.fixture(scope="module")
def runs(data_bin, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chunked_runs")
    jobs = [(train_counting_chunks, config(data_bin, tmp, *FAMILIES[family], "--ddp-backend", backend,
                                           "--loss-chunks", chunks)) for backend, family, chunks in RUNS]
    return dict(zip(RUNS, call_main(jobs[0][1], functools.partial(run_each, jobs))))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_training_equals_unchunked_on_two_ranks(backend, family, runs):
    plain, chunked = runs[backend, family, "1"], runs[backend, family, "4"]
    assert plain["chunks"] == [] and chunked["chunks"] == [4] * UPDATES  # every update's loss was chunked
    assert len(chunked["losses"]) == UPDATES and not any(chunked["clipped"])
    np.testing.assert_allclose(chunked["losses"], plain["losses"], rtol=1e-6)
    np.testing.assert_allclose(chunked["gnorms"], plain["gnorms"], rtol=1e-6)
    assert min(plain["gnorms"]) > 1e-2  # at lr 0.2, unclipped: every update moves the weights
    assert chunked["weights"].keys() == plain["weights"].keys()
    for name, weight in plain["weights"].items():
        np.testing.assert_allclose(chunked["weights"][name], weight, rtol=1e-5, atol=1e-6, err_msg=name)
    if family == "transformer_lm":
        assert "output_projection.weight" in plain["weights"]  # the untied weight used after forward


def test_more_chunks_than_a_batch_has_tokens_exit_2(data_bin, tmp_path, capsys):
    _, err = cli_refusal(train.main, [data_bin, *FAMILIES["transformer_lm"], "--tokens-per-sample", "16",
                                      "--batch-size", "4", "--cpu", "--threads", "1", "--max-update", "1",
                                      "--no-save", "--save-dir", str(tmp_path), "--loss-chunks", "100000"], capsys)
    assert "--loss-chunks 100000 splits a batch's tokens into 100000 chunks, but this run's batches hold at most " \
        "64 tokens" in err, err
