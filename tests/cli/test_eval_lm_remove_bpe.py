"""shard-eval-lm --remove-bpe on a sentencepiece data-bin (shard-preprocess's default tokenizer): alone it
removes sentencepiece's marks, as the data-bin records which tokenizer made it (issue 31, item 6); with a
value it does what fairseq does (subword_nmt: the ``@@`` marker, which sentencepiece's pieces never carry)."""
from types import SimpleNamespace

import pytest
import torch

from shardtrain.cli import eval_lm, preprocess
from shardtrain.data.dictionary import Dictionary
from shardtrain.data.tokenizers import load_tokenizer

# The split scored: 3 lines of 9, 8 and 7 words; each line ends with </s>, which counts as a word (fairseq).
VALID = ["the quick brown fox jumps over the lazy dog", "pack my box with five dozen liquor jugs",
         "sphinx of black quartz judge my vow"]
WORDS = 9 + 8 + 7 + 3


class UniformModel(torch.nn.Module):
    """Every token log p = -ln V: the token loss is log2 V, the word loss log2 V times tokens per word."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab, self.max_positions = vocab, 64

    def forward(self, tokens):
        return torch.zeros(*tokens.shape, self.vocab)


@pytest.fixture(scope="module")
def spm_bin(tmp_path_factory):
    d = tmp_path_factory.mktemp("spm")
    (d / "train.txt").write_text("\n".join(VALID * 20) + "\n")
    (d / "valid.txt").write_text("\n".join(VALID) + "\n")
    preprocess.main(["--trainpref", str(d / "train.txt"), "--validpref", str(d / "valid.txt"),
                     "--destdir", str(d / "bin"), "--spm-vocab-size", "60", "--no-progress-bar"])
    return str(d / "bin")


def eval_on(data, monkeypatch, *extra):
    from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

    def load(path, data, *args, **kwargs):  # the checkpoint's part; data, scoring and words are shard-eval-lm's
        task = LanguageModelingTask(LanguageModelingConfig(data=data, tokens_per_sample=64))
        return SimpleNamespace(task=task.cfg), task, UniformModel(len(task.dictionary)), torch.device("cpu")

    monkeypatch.setattr(eval_lm, "load_for_inference", load)
    # --sample-break-mode eos: a block per line, so no word is cut by a block's edge
    return eval_lm.main([data, "--path", "unused.pt", "--gen-subset", "valid", "--cpu",
                         "--sample-break-mode", "eos", *extra])


def test_bare_remove_bpe_merges_sentencepiece_pieces(spm_bin, monkeypatch, capsys):
    assert load_tokenizer(spm_bin).name == "spm"  # shard-preprocess's default
    vocab = len(Dictionary.load(f"{spm_bin}/dict.txt"))  # the uniform model's
    results = eval_on(spm_bin, monkeypatch, "--remove-bpe")
    assert results["words"] == WORDS < results["tokens"]  # some words are several pieces
    assert results["perplexity"] == pytest.approx(vocab, rel=1e-5)
    assert results["word_perplexity"] == pytest.approx(vocab ** (results["tokens"] / WORDS), rel=1e-5)
    assert results["word_perplexity"] > results["perplexity"] * 1.5
    out = capsys.readouterr().out
    assert "made with --tokenizer spm: removing sentencepiece's marks" in out
    assert f"Loss (base 2): {results['word_loss']:.4f}, Perplexity: {results['word_perplexity']:.2f}" in out
    # spelt out, the same; --remove-bpe=VALUE too
    assert eval_on(spm_bin, monkeypatch, "--remove-bpe", "sentencepiece")["words"] == WORDS
    assert eval_on(spm_bin, monkeypatch, "--remove-bpe=sentencepiece")["words"] == WORDS


def test_an_explicit_value_does_what_fairseq_does_and_says_what_to_pass(spm_bin, monkeypatch, capsys):
    """subword_nmt joins a piece ending in ``@@`` to the next: none does here, so every token is a word."""
    results = eval_on(spm_bin, monkeypatch, "--remove-bpe", "subword_nmt")
    assert results["words"] == results["tokens"] > WORDS
    assert results["word_perplexity"] == pytest.approx(results["perplexity"], rel=1e-9)
    said = capsys.readouterr().out  # the log's console
    assert ("--remove-bpe subword_nmt: no symbol of the dictionary carries '@@', so every token counts as a word "
            "and the word perplexity equals the token perplexity. Its symbols carry '\u2581': pass --remove-bpe "
            "sentencepiece.") in said
    # without --remove-bpe: tokens only
    assert "words" not in eval_on(spm_bin, monkeypatch)


def test_fairseq_aliases():
    assert eval_lm.fairseq_aliases(["d", "--remove-bpe"]) == (["d"], True)
    assert eval_lm.fairseq_aliases(["--remove-bpe", "--cpu"]) == (["--cpu"], True)
    assert eval_lm.fairseq_aliases(["--remove-bpe", "@@ "]) == (["--post-process", "@@ "], False)
    assert eval_lm.fairseq_aliases(["--remove-bpe=subword_nmt"]) == (["--post-process=subword_nmt"], False)
