"""The dataset-and-batching flags change the batches a run trains and validates on (issue 29: every flag
tested at a non-default value). Each run is one tiny in-process training; the batch sizes come from its
json log (bsz, valid_bsz: sentences per batch, averaged over the window's batches).

The corpus is sized so every count is known: lines of 31 words plus </s> are exactly one 32-token block
(--tokens-per-sample 32), train has 120 of them, valid (and test, the same text) 12.
"""
import math
import os
import types

import pytest
import torch

from shardtrain.cli import preprocess, train
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer import loop, validation
from st_testutils import MarkovChain, json_records, write_markov_corpus

TRAIN_BLOCKS, VALID_BLOCKS = 120, 12
MODEL = ["--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16",
         "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "32",
         "--log-format", "json", "--log-interval", "1", "--threads", "1", "--cpu", "--no-save"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("batching"))
    paths = write_markov_corpus(os.path.join(tmp, "text"), MarkovChain(n=8, seed=3), 31 * TRAIN_BLOCKS,
                                31 * VALID_BLOCKS, line_len=31)
    dest = os.path.join(tmp, "data-bin")
    preprocess.main(["--tokenizer", "space", "--trainpref", paths["train"], "--validpref", paths["valid"],
                     "--testpref", paths["valid"], "--destdir", dest, "--no-progress-bar"])
    return dest


def run(data_bin, tmp_path, name, *flags, updates=("--max-update", "2", "--validate-interval-updates", "2")):
    log = str(tmp_path / f"{name}.log")
    train.main([data_bin, *MODEL, "--save-dir", str(tmp_path / name), "--log-file", log, *updates, *flags])
    return log


def mean_batch(blocks: int, per_batch: int) -> float:
    """The mean sentences per batch when ``blocks`` equal blocks go ``per_batch`` at a time."""
    return blocks / math.ceil(blocks / per_batch)


@pytest.mark.slow
@pytest.mark.flag_effect("--max-tokens", "--required-batch-size-multiple")
def test_max_tokens_and_the_batch_size_multiple_set_the_training_batches(data_bin, tmp_path):
    five = run(data_bin, tmp_path, "five", "--max-tokens", "160", "--required-batch-size-multiple", "1")
    assert [r["bsz"] for r in json_records(five, "train_inner")] == [5, 5]  # 160 tokens: five 32-token blocks
    # validation takes --max-tokens too when --max-tokens-valid is not given: 12 blocks in batches of 5, 5, 2
    assert [r["valid_bsz"] for r in json_records(five, "valid")] == [pytest.approx(4.0)]
    four = run(data_bin, tmp_path, "four", "--max-tokens", "160", "--required-batch-size-multiple", "4")
    assert [r["bsz"] for r in json_records(four, "train_inner")] == [4, 4]  # 5 rounded down to a multiple of 4


@pytest.mark.slow
@pytest.mark.flag_effect("--max-tokens-valid", "--batch-size-valid", "--batch-size")
def test_validation_batches_have_their_own_limits(data_bin, tmp_path):
    log = run(data_bin, tmp_path, "tokens", "--max-tokens", "160", "--required-batch-size-multiple", "1",
              "--max-tokens-valid", "64")
    assert [r["bsz"] for r in json_records(log, "train_inner")] == [5, 5]  # training keeps --max-tokens
    assert [r["valid_bsz"] for r in json_records(log, "valid")] == [pytest.approx(mean_batch(VALID_BLOCKS, 2))]
    log = run(data_bin, tmp_path, "sentences", "--batch-size", "6", "--required-batch-size-multiple", "1",
              "--batch-size-valid", "3")
    assert [r["bsz"] for r in json_records(log, "train_inner")] == [6, 6]
    assert [r["valid_bsz"] for r in json_records(log, "valid")] == [pytest.approx(mean_batch(VALID_BLOCKS, 3))]


@pytest.mark.slow
@pytest.mark.flag_effect("--train-subset", "--valid-subset")
def test_the_subsets_name_the_splits_trained_and_validated_on(data_bin, tmp_path):
    log = run(data_bin, tmp_path, "test", "--batch-size", "4", "--required-batch-size-multiple", "1",
              "--train-subset", "test", "--valid-subset", "test", updates=("--max-epoch", "1"))
    # one epoch of the 12-block test split is 3 updates (the train split's would be 30)
    assert [int(r["num_updates"]) for r in json_records(log, "train_inner")] == [1, 2, 3]
    assert json_records(log, "valid") == []
    (record,) = json_records(log, "test")  # reported under the subset's name, at the end of the epoch
    assert record["test_num_updates"] == 3 and record["test_bsz"] == pytest.approx(4.0)


@pytest.mark.flag_effect("--fixed-validation-seed")
def test_fixed_validation_seed_is_the_random_state_validation_draws_from(monkeypatch):
    monkeypatch.setattr(validation, "_validate_subsets", lambda run, epoch: [torch.rand(4)])  # what a subset draws

    def draws(*flags):
        cfg = parse_train_args(["data-bin", *flags])
        run = types.SimpleNamespace(cfg=cfg, backend=types.SimpleNamespace(device=torch.device("cpu")))
        return loop.validate(run, epoch=1)[0], torch.rand(4)  # validation's draw, then training's next one

    torch.manual_seed(0)
    seeded, after = draws("--fixed-validation-seed", "5")
    assert torch.equal(seeded, torch.rand(4, generator=torch.Generator().manual_seed(5)))
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(4))  # training's stream went on as if validation drew nothing
    torch.manual_seed(0)
    plain, _ = draws()
    assert torch.equal(plain, torch.rand(4, generator=torch.Generator().manual_seed(0)))  # unseeded: training's
