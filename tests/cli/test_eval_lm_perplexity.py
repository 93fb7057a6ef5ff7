"""shard-eval-lm: fairseq-eval-lm's perplexity, context window, word level and word-probs lines
(fairseq_cli/eval_lm.py and fairseq/data/lm_context_window_dataset.py are what it mirrors)."""
import math
import os
import pathlib
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from shardtrain.cli import eval_lm, preprocess, train, validate
from shardtrain.data.dictionary import Dictionary
from shardtrain.trainer.checkpoint.inference import load_for_inference
from st_testutils import MarkovChain, cli_refusal, tiny_model_flags, write_markov_corpus

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
FAIRSEQ_CKPT = str(FIXTURES / "fairseq-0.12-transformer_lm.pt")
FAIRSEQ_DATA = str(FIXTURES / "fairseq-0.12-data-bin")
FAIRSEQ_VALID_LOSS = 7.508  # fairseq 0.12.2 at update 200, base 2, --tokens-per-sample 64 (fixtures' README)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained on a Markov language whose word w2 is split into the subwords ``w@@ 2``."""
    d = str(tmp_path_factory.mktemp("evallm"))
    paths = write_markov_corpus(os.path.join(d, "text"), MarkovChain(n=6, seed=4), 20000, 3000, line_len=25)
    for path in paths.values():
        text = pathlib.Path(path).read_text()
        pathlib.Path(path).write_text(re.sub(r"\bw2\b", "w@@ 2", text))
    data = os.path.join(d, "data-bin")
    preprocess.main(["--tokenizer", "space", "--trainpref", paths["train"], "--validpref", paths["valid"],
                     "--destdir", data, "--no-progress-bar"])
    train.main([data, *tiny_model_flags(), "--cpu", "--max-update", "300", "--lr", "0.003", "--optimizer", "adam",
                "--lr-scheduler", "fixed", "--save-dir", f"{d}/ck", "--no-epoch-checkpoints"])
    return data, f"{d}/ck/checkpoint_last.pt"


def run(data, path, *extra):
    return eval_lm.main([data, "--path", path, "--gen-subset", "valid", "--cpu", *extra])


@pytest.mark.slow
def test_perplexity_equals_shard_validates_loss(trained, capsys):
    data, path = trained
    results = run(data, path, "--batch-size", "3")
    valid = validate.main([data, "--path", path, "--cpu"])["valid"]
    assert abs(results["loss"] - valid["loss"]) < 6e-4, (results, valid)  # validate rounds to 3 decimals
    assert results["perplexity"] == pytest.approx(2 ** results["loss"])
    out = capsys.readouterr().out
    assert re.search(r"Evaluated [\d,]+ tokens in [\d.]+s \([\d.]+ tokens/s\)", out), out
    assert f"Loss (base 2): {results['loss']:.4f}, Perplexity: {results['perplexity']:.2f}" in out
    # batching does not change a number
    assert run(data, path, "--max-tokens", "40")["loss"] == pytest.approx(results["loss"], abs=1e-6)


@pytest.mark.slow
def test_context_window_scores_each_block_after_its_context(trained):
    """Each block's log-probs are those of the model run over the stream from up to N tokens earlier."""
    data, path = trained
    cfg, task, model, device = load_for_inference(path, data, cpu=True)
    window, block = 12, 20
    task.cfg.tokens_per_sample = block
    dataset = task.dataset("valid")
    stream = torch.cat([dataset[i]["target"] for i in range(len(dataset))])
    inputs = torch.cat([torch.tensor([task.dictionary.eos()]), stream[:-1]])  # the source: shifted by one
    batches = eval_lm.batch_indices(dataset.sizes, None, 3, window)
    scored = list(eval_lm.score_split(model, dataset, batches, window, task.dictionary.pad(), 7, device))
    assert [i for i, _, _ in scored] == list(range(len(dataset)))
    begin = 0
    for i, target, scores in scored:
        end = begin + len(target)
        first = max(0, begin - window)
        with torch.no_grad():
            lprobs = F.log_softmax(model(inputs[first:end].view(1, -1))[0].float(), dim=-1)
        expected = lprobs[begin - first:].gather(1, stream[begin:end].unsqueeze(1)).squeeze(1)
        assert torch.equal(target, stream[begin:end])
        torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-5)
        begin = end
    assert begin == len(stream)


def test_context_window_does_not_raise_perplexity():
    """On the model fairseq trained (our tiny model's later positions are worse than its first ones, so a
    window, which moves every scored token later, says more about that model than about the window)."""
    args = [FAIRSEQ_DATA, "--path", FAIRSEQ_CKPT, "--gen-subset", "valid", "--cpu", "--tokens-per-sample", "64"]
    plain = eval_lm.main(args)
    windowed = eval_lm.main(args + ["--context-window", "32"])
    assert windowed["tokens"] == plain["tokens"]  # every token scored once either way
    assert windowed["loss"] < plain["loss"], (plain, windowed)
    assert abs(plain["loss"] - FAIRSEQ_VALID_LOSS) < 0.01, plain


@pytest.mark.slow
def test_output_word_probs_and_word_level_perplexity(trained, capsys):
    data, path = trained
    tokens = run(data, path)
    capsys.readouterr()
    words = run(data, path, "--remove-bpe", "--output-word-probs")
    out = capsys.readouterr().out
    lines = [line.split(" | ")[-1] for line in out.splitlines() if re.search(r"\| \d+ \S+ \[", line)]
    assert len(lines) == math.ceil(tokens["tokens"] / 32)  # one per block of --tokens-per-sample 32
    counted = merged = 0
    for number, line in enumerate(lines):
        index, rest = line.split(" ", 1)
        assert int(index) == number
        entries = rest.split("\t")
        assert all(re.fullmatch(r"\S+ \[-?\d+\.\d{6}\]", e) for e in entries), entries
        # "w@@ 2" merged into w2 (unless the block's edge cuts it, as in fairseq)
        assert not any("@@" in e for e in entries) and not any(e.startswith("2 ") for e in entries[1:])
        merged += sum(e.startswith("w2 ") for e in entries)
        counted += len(entries)
    assert merged > 10 and counted == words["words"] < words["tokens"] == tokens["tokens"]
    # the same log-probs, summed over fewer units
    assert words["word_loss"] * words["words"] == pytest.approx(tokens["loss"] * tokens["tokens"], rel=1e-6)
    assert f"Loss (base 2): {words['word_loss']:.4f}, Perplexity: {words['word_perplexity']:.2f}" in out


def test_group_words_for_subword_nmt_and_sentencepiece():
    d = Dictionary()
    ids = {s: d.add_symbol(s) for s in ("the@@", "re", "cat", "\u2581the", "\u2581cat", "x@@")}
    eos = d.eos()
    toks = [ids["the@@"], ids["re"], ids["cat"], eos, ids["x@@"]]
    assert eval_lm.group_words(d, toks, [1.0, 2.0, 4.0, 8.0, 16.0], "@@") == [
        ("there", 3.0), ("cat", 4.0), ("</s>", 8.0), ("x", 16.0)]  # a piece cut by the block's end stands alone
    toks = [ids["re"], ids["\u2581the"], ids["re"], ids["\u2581cat"], eos, ids["re"]]
    assert eval_lm.group_words(d, toks, [1.0, 2.0, 4.0, 8.0, 16.0, 32.0], "\u2581") == [
        ("re", 1.0), ("there", 6.0), ("cat", 8.0), ("</s>", 16.0), ("re", 32.0)]
    assert [w for w, _ in eval_lm.group_words(d, toks, [0.0] * 6, None)] == [d[t] for t in toks]


@pytest.mark.slow
def test_bad_input_is_one_paragraph(trained, tmp_path, capsys):
    data, path = trained
    err = cli_refusal(eval_lm.main, [data, "--path", str(tmp_path / "none.pt"), "--cpu"], capsys)[1]
    assert "none.pt" in err
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(pathlib.Path(path).read_bytes()[:5000])
    err = cli_refusal(eval_lm.main, [data, "--path", str(damaged), "--cpu"], capsys)[1]
    assert "damaged.pt" in err
    err = cli_refusal(eval_lm.main, [data, "--path", path, "--cpu"], capsys)[1]  # fairseq's default: test
    assert "Split 'test' not found" in err and "--gen-subset" in err and "valid" in err
    err = cli_refusal(eval_lm.main, [data, "--path", path, "--cpu", "--gen-subset", "valid",
                                     "--context-window", "32"], capsys)[1]
    assert "--context-window 32 leaves no token to score" in err
    err = cli_refusal(eval_lm.main, [data, "--path", path, "--cpu", "--tokens-per-sample", "64"], capsys)[1]
    assert "exceeds the model's 32 positions" in err
    err = cli_refusal(eval_lm.main, [data, "--path", path, "--softmax-batch", "0"], capsys)[1]
    assert "--softmax-batch must be >= 1" in err


def test_softmax_batch_changes_nothing():
    logits = torch.randn(11, 9)
    target = torch.randint(0, 9, (11,))
    whole = eval_lm.target_log_probs(logits, target, 10 ** 9)
    torch.testing.assert_close(eval_lm.target_log_probs(logits, target, 3), whole)
    assert whole[4] == pytest.approx(float(logits[4].log_softmax(-1)[target[4]]), abs=1e-6)
    assert math.isclose(float(whole.sum()), float(F.cross_entropy(logits, target, reduction="sum")) * -1,
                        rel_tol=1e-5)


# --context-window larger than the block it feeds (fairseq's recipe shape: --tokens-per-sample 512
# --context-window 400 scores blocks of 112 tokens, each after 400 of context, carried over several
# earlier blocks). The model below makes every score say how much left context its token had.
class PositionModel(torch.nn.Module):
    """Scores any token but id 0 (bos, never a target here) at row position t with log p =
    -log(e^(t/2) + V - 1): the number of tokens the row held before it. Records the rows it is fed."""

    def __init__(self, vocab, max_positions):
        super().__init__()
        self.vocab, self.max_positions, self.rows = vocab, max_positions, []

    def forward(self, tokens):
        self.rows.extend(tokens.tolist())
        logits = torch.zeros(*tokens.shape, self.vocab)
        logits[:, :, 0] = torch.arange(tokens.shape[1], dtype=torch.float32) / 2
        return logits


def position_log_prob(t, vocab):
    return -math.log(math.exp(t / 2) + vocab - 1)


@pytest.fixture(scope="module")
def abcd_bin(tmp_path_factory):
    """valid: 3 lines "a b c d", so the stream is (a b c d </s>) x 3, 15 tokens."""
    d = tmp_path_factory.mktemp("abcd")
    (d / "valid.txt").write_text("a b c d\n" * 3)
    preprocess.main(["--tokenizer", "space", "--trainpref", str(d / "valid.txt"), "--validpref",
                     str(d / "valid.txt"), "--destdir", str(d / "bin"), "--no-progress-bar"])
    return str(d / "bin")


def eval_with(model, monkeypatch, data, *extra):
    from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

    def load(path, data, cpu, dtype, user_dir=None):  # the checkpoint's part; the task, data and batching are shard-eval-lm's
        task = LanguageModelingTask(LanguageModelingConfig(data=data, tokens_per_sample=model.max_positions))
        return SimpleNamespace(task=task.cfg), task, model, torch.device("cpu")

    monkeypatch.setattr(eval_lm, "load_for_inference", load)
    return eval_lm.main([data, "--path", "unused.pt", "--gen-subset", "valid", "--cpu", *extra])


@pytest.mark.flag_effect("--context-window", "--tokens-per-sample")
@pytest.mark.parametrize("batching", [["--batch-size", "1"], ["--batch-size", "3"], []])
def test_a_context_window_larger_than_the_block_by_hand(batching, abcd_bin, monkeypatch):
    """--tokens-per-sample 7 --context-window 5: blocks of 7 - 5 = 2 scored tokens (the last one 1),
    block j after min(5, 2j) tokens of context, written out here; every token scored once."""
    vocab = 8  # </s> <pad> <s> <unk> a b c d: a multiple of --padding-factor 8
    model = PositionModel(vocab, max_positions=7)
    results = eval_with(model, monkeypatch, abcd_bin, "--tokens-per-sample", "7", "--context-window", "5", *batching)
    blocks = [2, 2, 2, 2, 2, 2, 2, 1]
    contexts = [0, 2, 4, 5, 5, 5, 5, 5]  # the context grows over three blocks, then stays 5 > 2
    logprob = sum(position_log_prob(c + i, vocab) for c, n in zip(contexts, blocks) for i in range(n))
    assert results["tokens"] == 15
    assert results["loss"] == pytest.approx(-logprob / 15 / math.log(2), rel=1e-6)
    # each row: its context, then its block, from the source stream (</s> a b c d </s> a ...: the targets
    # shifted right by one), nothing skipped or repeated
    ids = Dictionary.load(os.path.join(abcd_bin, "dict.txt"))
    targets = [ids.index(w) for w in "a b c d </s> a b c d </s> a b c d </s>".split()]
    source = [ids.eos()] + targets[:-1]
    assert len(model.rows) == 8
    begin = 0
    for row, context, n in zip(model.rows, contexts, blocks):
        assert row[:context + n] == source[begin - context:begin + n]
        assert all(t == ids.pad() for t in row[context + n:])
        begin += n


def fairseq_rows(blocks, context):
    """fairseq's LMContextWindowDataset.collater (fairseq/data/lm_context_window_dataset.py), for the
    blocks' sources in order: (row, where its block starts)."""
    prev, out = [], []
    for source in blocks:
        extra = len(prev) + len(source) - (max(map(len, blocks)) + context)  # never > 0, as in fairseq
        prev = prev[extra:] if extra > 0 else prev
        out.append((prev + source, len(prev)))
        prev = (prev + source)[-context:]
    return out


@pytest.mark.flag_effect("--context-window", "--tokens-per-sample")
@pytest.mark.parametrize("block,window,break_mode", [(3, 20, "none"), (7, 5, "none"), (9, 30, "eos"),
                                                     (12, 25, "complete")])
@pytest.mark.slow
def test_context_windows_feed_the_rows_fairseq_feeds(block, window, break_mode, trained):
    """Rows and scores of score_split against fairseq's collater, on the tiny model's data-bin
    (blocks of 25-token lines and their ends), in batches of 4."""
    data, path = trained
    _, task, _, _ = load_for_inference(path, data, cpu=True)
    task.cfg.tokens_per_sample, task.cfg.sample_break_mode = block, break_mode
    dataset = task.dataset("valid")
    vocab = len(task.dictionary)
    model = PositionModel(vocab, max_positions=block + window)
    batches = eval_lm.batch_indices(dataset.sizes, None, 4, window)
    scored = list(eval_lm.score_split(model, dataset, batches, window, task.dictionary.pad(), 10 ** 9, "cpu"))
    expected = fairseq_rows([dataset[i]["source"].tolist() for i in range(len(dataset))], window)
    assert [i for i, _, _ in scored] == list(range(len(dataset))) and len(model.rows) == len(expected)
    assert any(start > block for _, start in expected) == (window > block)  # context over several blocks
    for (i, target, scores), fed, (row, start) in zip(scored, model.rows, expected):
        assert fed[:len(row)] == row and set(fed[len(row):]) <= {task.dictionary.pad()}
        assert torch.equal(target, dataset[i]["target"])
        torch.testing.assert_close(scores, torch.tensor([position_log_prob(start + k, vocab)
                                                         for k in range(len(target))]), rtol=1e-6, atol=1e-6)


def test_a_context_window_not_below_tokens_per_sample_is_one_paragraph(abcd_bin, monkeypatch, capsys):
    """fairseq-eval-lm subtracts the window from --tokens-per-sample and fails on the block size it
    gets (0 or less); here it is one paragraph, before anything is read."""
    model = PositionModel(8, max_positions=7)
    for window in ("7", "40"):
        _, err = cli_refusal(lambda argv: eval_with(model, monkeypatch, abcd_bin, *argv),
                             ["--tokens-per-sample", "7", "--context-window", window], capsys)
        assert f"--context-window {window} leaves no token to score in blocks of --tokens-per-sample 7" in err
    assert model.rows == []
