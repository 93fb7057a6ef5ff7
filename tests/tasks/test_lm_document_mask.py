"""``--attn-mask-type block_causal``: the language_modeling task numbers the documents of each source row
(a document starts at each </s>, the token fairseq's source puts before every line) in ``net_input``'s
``document_ids``, for its batches and its dummy batch alike; the default, causal, adds nothing. A packed sample
then trains exactly as its lines do one per sample (``--sample-break-mode eos``), on which the flag changes
nothing.

The data-bin holds three lines ("a b c", "d e", "f g h i j"; each ends with </s>), as in
tests/trainer/test_task_flags.py, which writes out the samples each break mode cuts.
"""
import pytest
import torch
import torch.nn.functional as F

from shardtrain.config.run_config import parse_train_args
from shardtrain.tasks.language_modeling import LanguageModelingTask
from shardtrain.trainer.resolved import Components, build_criterion, build_model, build_task

LINES = "a b c\nd e\nf g h i j\n"
MODEL = ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
         "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--dropout", "0"]
BLOCK_CAUSAL = ["--attn-mask-type", "block_causal"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    from shardtrain.cli import preprocess

    folder = tmp_path_factory.mktemp("docs")
    (folder / "text.txt").write_text(LINES)
    dest = str(folder / "data-bin")
    preprocess.main(["--tokenizer", "space", "--trainpref", str(folder / "text.txt"), "--validpref",
                     str(folder / "text.txt"), "--destdir", dest, "--no-progress-bar"])
    return dest


def _task(data_bin, *flags):
    cfg = parse_train_args([data_bin, *MODEL, *flags])
    components = Components.of(cfg)
    task = build_task(cfg, components)
    assert type(task) is LanguageModelingTask  # the task these tests are about, as the trainer builds it
    task.load_dataset("valid")
    return cfg, components, task


def _batch(task, indices):
    return task.collater([task.datasets["valid"][i] for i in indices])


@pytest.mark.flag_effect("--attn-mask-type")
def test_block_causal_numbers_each_rows_documents(data_bin):
    _, _, task = _task(data_bin, "--tokens-per-sample", "8", *BLOCK_CAUSAL)
    batch = _batch(task, [0, 1])
    words = task.dictionary
    assert [" ".join(words[t] for t in row) for row in batch["net_input"]["src_tokens"]] == [
        "</s> a b c </s> d e </s>", "f g h i j <pad> <pad> <pad>"]
    # by hand: </s> a b c | </s> d e | </s> (f, its first target); the second row: the rest of that line, padded
    assert batch["net_input"]["document_ids"].tolist() == [[1, 1, 1, 1, 2, 2, 2, 3], [0] * 8]
    dummy = task.dummy_batch(3, 5)["net_input"]  # what shard-plan traces and the memory check runs
    assert dummy["document_ids"].shape == (3, 5) and dummy["document_ids"].dtype == torch.long


def test_causal_adds_no_document_ids(data_bin):
    _, _, task = _task(data_bin, "--tokens-per-sample", "8")
    assert set(_batch(task, [0, 1])["net_input"]) == {"src_tokens", "src_lengths"}
    assert set(task.dummy_batch(3, 5)["net_input"]) == {"src_tokens", "src_lengths"}


def _line_losses(model, task):
    """Each line's per-token losses as its own --sample-break-mode eos sample ("</s> a b c" -> "a b c </s>")."""
    out = []
    for i in range(len(task.datasets["valid"])):
        item = task.datasets["valid"][i]
        logits = model(item["source"][None].long())[0]
        out.append(F.cross_entropy(logits, item["target"].long(), reduction="none"))
    return out


@pytest.mark.flag_effect("--attn-mask-type")
def test_a_packed_sample_trains_as_its_lines_one_per_sample(data_bin):
    cfg, components, task = _task(data_bin, "--tokens-per-sample", "8", *BLOCK_CAUSAL)
    torch.manual_seed(0)
    model = build_model(cfg, components, task)
    criterion = build_criterion(cfg, components, task)
    packed, _, _ = criterion(model, _batch(task, [0]))  # the criterion hands the model its document_ids
    _, _, lines_task = _task(data_bin, "--tokens-per-sample", "8", "--sample-break-mode", "eos")
    first, second, third = _line_losses(model, lines_task)
    expected = first.sum() + second.sum() + third[0]  # the sample ends with the third line's </s>: "f" only
    assert abs(packed.item() - expected.item()) <= 1e-5 * expected.item(), (packed.item(), expected.item())
    causal_cfg, _, causal_task = _task(data_bin, "--tokens-per-sample", "8")
    causal, _, _ = build_criterion(causal_cfg, components, causal_task)(model, _batch(causal_task, [0]))
    assert abs(causal.item() - expected.item()) > 1e-3 * expected.item()  # without the mask: not the lines'


def test_block_causal_changes_nothing_when_each_sample_is_one_line(data_bin):
    cfg, components, task = _task(data_bin, "--tokens-per-sample", "8", "--sample-break-mode", "eos", *BLOCK_CAUSAL)
    torch.manual_seed(0)
    model = build_model(cfg, components, task)
    criterion = build_criterion(cfg, components, task)
    batch = _batch(task, [0, 1, 2])
    masked, _, _ = criterion(model, batch)
    del batch["net_input"]["document_ids"]
    plain, _, _ = criterion(model, batch)
    assert abs(masked.item() - plain.item()) <= 1e-5 * plain.item()
