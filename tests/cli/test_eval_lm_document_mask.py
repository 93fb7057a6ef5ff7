"""shard-eval-lm and shard-validate on a checkpoint trained with ``--attn-mask-type block_causal``: by default
they score within each document, as the run's own valid records did; ``--attn-mask-type causal`` scores the packed
block as one sequence. The refusals: the option for a task without it, a model that cannot take document ids.

The data-bin holds three lines ("a b c", "d e", "f g h i j"; each ends with </s>), 13 tokens, as in
tests/tasks/test_lm_document_mask.py. Trained with --tokens-per-sample 16, the valid split is one block: source
"</s> a b c </s> d e </s> f g h i j", target "a b c </s> d e </s> f g h i j </s>". Its documents are the lines,
each with the </s> before it as its start token (docs/training.md), written out below."""
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from shardtrain.cli import eval_lm, preprocess, train, validate
from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
from shardtrain.trainer.checkpoint.inference import load_for_inference
from st_testutils import cli_refusal

LINES = [["a", "b", "c"], ["d", "e"], ["f", "g", "h", "i", "j"]]
MODEL = ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim",
         "32", "--decoder-attention-heads", "2", "--decoder-learned-pos", "--dropout", "0"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs")
    (folder / "text.txt").write_text("".join(" ".join(line) + "\n" for line in LINES))
    dest = str(folder / "data-bin")
    preprocess.main(["--tokenizer", "space", "--trainpref", str(folder / "text.txt"), "--validpref",
                     str(folder / "text.txt"), "--destdir", dest, "--no-progress-bar"])
    return dest


@pytest.fixture(scope="module")
def trained(data_bin, tmp_path_factory):
    save = str(tmp_path_factory.mktemp("ck"))
    train.main([data_bin, *MODEL, "--tokens-per-sample", "16", "--attn-mask-type", "block_causal", "--cpu",
                "--threads", "1", "--optimizer", "adam", "--lr", "0.01", "--max-update", "4", "--batch-size", "1",
                "--save-dir", save, "--no-epoch-checkpoints", "--log-format", "none"])
    path = save + "/checkpoint_last.pt"
    _, task, model, _ = load_for_inference(path, data_bin, cpu=True)
    assert task.cfg.attn_mask_type == "block_causal"  # what the commands read as their default
    return path, task.dictionary, model


def _log_probs(model, source, target):
    """Summed log p(target) of the model run over ``source`` alone, without document ids."""
    with torch.no_grad():
        lprobs = F.log_softmax(model(torch.tensor([source]))[0].float(), dim=-1)
    return lprobs.gather(1, torch.tensor(target)[:, None]).sum().item()


def _base2_loss(logprob, tokens=13):
    return -logprob / tokens / math.log(2)


def expected_losses(dictionary, model):
    """(per document, as one sequence): each line run alone from the </s> before it, and the whole block."""
    eos = dictionary.eos()
    lines = [[dictionary.index(w) for w in line] for line in LINES]
    per_document = sum(_log_probs(model, [eos] + line, line + [eos]) for line in lines)
    stream = [t for line in lines for t in line + [eos]]
    return _base2_loss(per_document), _base2_loss(_log_probs(model, [eos] + stream[:-1], stream))


def eval_loss(data_bin, path, *extra):
    result = eval_lm.main([data_bin, "--path", path, "--gen-subset", "valid", "--cpu", *extra])
    assert result["tokens"] == 13
    return result["loss"]


@pytest.mark.slow
def test_eval_lm_scores_a_block_causal_checkpoint_per_document(data_bin, trained):
    path, dictionary, model = trained
    per_document, one_sequence = expected_losses(dictionary, model)
    assert abs(per_document - one_sequence) > 1e-2, (per_document, one_sequence)  # the mask shows in the loss
    assert eval_loss(data_bin, path) == pytest.approx(per_document, rel=1e-5)
    assert eval_loss(data_bin, path, "--attn-mask-type", "causal") == pytest.approx(one_sequence, rel=1e-5)
    # blocks of 8 - 5 = 3 tokens after up to 5 of context: every token's document begins within its window
    # (the longest, "</s> f g h i j", has 6 source tokens), and no token sees the document before its own
    windowed = eval_loss(data_bin, path, "--tokens-per-sample", "8", "--context-window", "5")
    assert windowed == pytest.approx(per_document, rel=1e-5)


@pytest.mark.slow
def test_validate_masks_as_the_checkpoint_did_unless_told(data_bin, trained):
    path, dictionary, model = trained
    per_document, one_sequence = expected_losses(dictionary, model)

    def loss(*extra):
        return validate.main([data_bin, "--path", path, "--cpu", "--log-format", "none", *extra])["valid"]["loss"]

    assert loss() == pytest.approx(per_document, abs=6e-4)  # validate rounds to 3 decimals
    assert loss("--attn-mask-type", "causal") == pytest.approx(one_sequence, abs=6e-4)


class TokensOnly(torch.nn.Module):
    """A model whose forward takes src_tokens only (a plugin's, say): every token equally likely."""

    max_positions = 16

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, src_tokens):
        return torch.zeros(*src_tokens.shape, self.vocab)


class OwnTask(LanguageModelingTask):
    """A plugin's task, whose config has no --attn-mask-type."""


def _eval_argv(monkeypatch, task, data, *extra):
    model = TokensOnly(len(task.dictionary))

    def load(path, data, cpu, dtype, user_dir=None):
        return SimpleNamespace(task=task.cfg), task, model, torch.device("cpu")

    monkeypatch.setattr(eval_lm, "load_for_inference", load)
    return [data, "--path", "unused.pt", "--gen-subset", "valid", "--cpu", *extra]


def test_block_causal_for_a_model_that_cannot_take_document_ids_is_refused(data_bin, monkeypatch, capsys):
    def task():
        return LanguageModelingTask(LanguageModelingConfig(data=data_bin, tokens_per_sample=16))

    argv = _eval_argv(monkeypatch, task(), data_bin, "--attn-mask-type", "block_causal")
    _, err = cli_refusal(eval_lm.main, argv, capsys)
    assert "The task gives the model document_ids, which TokensOnly.forward does not take" in err, err
    assert "drop --attn-mask-type block_causal" in err, err
    uniform = eval_lm.main(_eval_argv(monkeypatch, task(), data_bin))  # the checkpoint's causal: scored as ever
    assert uniform["loss"] == pytest.approx(math.log2(len(task().dictionary)), rel=1e-6)


def test_attn_mask_type_for_a_task_without_the_option_is_refused(data_bin, monkeypatch, capsys):
    task = OwnTask(LanguageModelingConfig(data=data_bin, tokens_per_sample=16))
    task.cfg = SimpleNamespace(data=data_bin, tokens_per_sample=16, sample_break_mode="none")
    _, err = cli_refusal(eval_lm.main, _eval_argv(monkeypatch, task, data_bin, "--attn-mask-type", "causal"), capsys)
    assert "--attn-mask-type causal: the checkpoint's task (OwnTask) has no attention mask option" in err, err
    assert "Drop --attn-mask-type" in err, err
