"""The language_modeling flags, given on shard-train's command line, cut the samples fairseq 0.12 cuts.

A data-bin of three lines ("a b c", "d e", "f g h i j"; each ends with </s>, 13 tokens in all) is
read by the task the trainer builds (``build_task``); each sample's target is its block of tokens and
its source the same tokens shifted right by one (the token before, </s> at the very start), as in
fairseq's TokenBlockDataset. The samples are written out below as text.
"""
import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.resolved import Components, build_task

LINES = "a b c\nd e\nf g h i j\n"


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    from shardtrain.cli import preprocess

    folder = tmp_path_factory.mktemp("lm")
    (folder / "text.txt").write_text(LINES)
    dest = str(folder / "data-bin")
    preprocess.main(["--tokenizer", "space", "--trainpref", str(folder / "text.txt"), "--validpref",
                     str(folder / "text.txt"), "--destdir", dest, "--no-progress-bar"])
    return dest


def samples(data_bin, *flags):
    """(source, target) of every valid sample, as text."""
    cfg = parse_train_args([data_bin, *flags])
    task = build_task(cfg, Components.of(cfg))
    task.load_dataset("valid")
    words = task.dictionary
    dataset = task.datasets["valid"]
    return [tuple(" ".join(words[i] for i in dataset[k][key]) for key in ("source", "target"))
            for k in range(len(dataset))]


@pytest.mark.flag_effect("--tokens-per-sample")
def test_none_fills_blocks_of_tokens_per_sample(data_bin):
    assert samples(data_bin, "--tokens-per-sample", "5") == [
        ("</s> a b c </s>", "a b c </s> d"), ("d e </s> f g", "e </s> f g h"), ("h i j", "i j </s>")]
    assert samples(data_bin, "--tokens-per-sample", "8") == [
        ("</s> a b c </s> d e </s>", "a b c </s> d e </s> f"), ("f g h i j", "g h i j </s>")]


@pytest.mark.flag_effect("--sample-break-mode")
def test_eos_is_one_line_per_sample(data_bin):
    assert samples(data_bin, "--sample-break-mode", "eos", "--tokens-per-sample", "6") == [
        ("</s> a b c", "a b c </s>"), ("</s> d e", "d e </s>"), ("</s> f g h i j", "f g h i j </s>")]


@pytest.mark.flag_effect("--sample-break-mode")
def test_complete_packs_whole_lines(data_bin):
    # 4 + 3 tokens fit 8; the third line (6 tokens) does not fit after them (none cuts it, above)
    assert samples(data_bin, "--sample-break-mode", "complete", "--tokens-per-sample", "8") == [
        ("</s> a b c </s> d e", "a b c </s> d e </s>"), ("</s> f g h i j", "f g h i j </s>")]


@pytest.mark.flag_effect("--add-bos-token")
def test_add_bos_token_starts_source_and_target_within_the_sample_size(data_bin):
    # blocks of 5 - 1 = 4 tokens, then <s> before both source and target
    assert samples(data_bin, "--tokens-per-sample", "5", "--add-bos-token") == [
        ("<s> </s> a b c", "<s> a b c </s>"), ("<s> </s> d e </s>", "<s> d e </s> f"),
        ("<s> f g h i", "<s> g h i j"), ("<s> j", "<s> </s>")]
