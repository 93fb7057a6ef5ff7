"""The model learns: on an order-2 Markov language of known entropy, validation
loss falls to within 10% of the entropy rate."""
import pytest

from shardtrain.cli import preprocess, train
from st_testutils import MarkovChain, json_records, write_markov_corpus

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


def test_valid_loss_reaches_the_entropy_rate(tmp_path):
    chain = MarkovChain(n=12, concentration=0.3, seed=3)
    entropy = chain.entropy_rate_bits()
    assert 1.0 < entropy < 3.0  # a language that is neither trivial nor uniform (log2 12 = 3.58)
    paths = write_markov_corpus(str(tmp_path / "text"), chain, 100_000, 10_000, line_len=500)
    data = str(tmp_path / "data-bin")
    preprocess.main(["--tokenizer", "space", "--trainpref", paths["train"], "--validpref", paths["valid"],
                     "--destdir", data, "--no-progress-bar"])
    log = str(tmp_path / "train.log")
    train.main([data, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "64",
                "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "4", "--decoder-normalize-before",
                "--dropout", "0.0", "--tokens-per-sample", "64", "--batch-size", "16", "--required-batch-size-multiple",
                "1", "--optimizer", "adam", "--lr", "0.01", "--lr-scheduler", "inverse_sqrt", "--warmup-updates",
                "30", "--max-update", "1000", "--validate-interval", "1000", "--validate-interval-updates", "250",
                "--no-save", "--save-dir", str(tmp_path / "ck"), "--log-format", "json", "--log-interval", "100",
                "--log-file", log, "--threads", "1"])
    valid = [r["valid_loss"] for r in json_records(log, "valid")]
    assert valid[0] > valid[-1]
    assert valid[-1] <= 1.10 * entropy, (valid, entropy)
