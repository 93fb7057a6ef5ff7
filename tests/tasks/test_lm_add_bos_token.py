"""--add-bos-token on the language_modeling task, with fairseq 0.12.2's meaning
(fairseq/data/monolingual_dataset.py, _maybe_add_bos: the dictionary's bos goes before
both source and target). Blocks are cut one token shorter so a sample still fits
--tokens-per-sample (the model's context)."""
import dataclasses
import pathlib

import pytest

from shardtrain.core.errors import DataError
from shardtrain.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask

DATA = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "fairseq-0.12-data-bin"


def _task(**overrides):
    cfg = dataclasses.replace(LanguageModelingConfig(data=str(DATA)), **overrides)
    task = LanguageModelingTask(cfg)
    task.load_dataset("valid")
    return task, task.datasets["valid"]


@pytest.mark.parametrize("mode", ["none", "complete", "eos"])
def test_bos_starts_source_and_target_and_sample_fits(mode):
    plain_task, plain = _task(tokens_per_sample=8, sample_break_mode=mode)
    task, with_bos = _task(tokens_per_sample=9, sample_break_mode=mode, add_bos_token=True)
    bos = task.dictionary.bos()
    assert len(with_bos) == len(plain)  # the same blocks: cut at tokens_per_sample - 1
    for i in range(len(plain)):
        item, ref = with_bos[i], plain[i]
        assert item["source"].tolist() == [bos] + ref["source"].tolist()
        assert item["target"].tolist() == [bos] + ref["target"].tolist()
        assert with_bos.sizes[i] == plain.sizes[i] + 1 == len(item["source"])
        # complete keeps an over-long line whole, as fairseq does; the others fit the context
        assert mode == "complete" or len(item["source"]) <= 9


def test_without_the_flag_no_bos_appears():
    task, ds = _task(tokens_per_sample=8)
    assert all(ds[i]["source"][0].item() != task.dictionary.bos() for i in range(len(ds)))


def test_tokens_per_sample_must_leave_room_for_a_token():
    with pytest.raises(DataError, match="at least 2 with --add-bos-token"):
        LanguageModelingTask(LanguageModelingConfig(data=str(DATA), tokens_per_sample=1, add_bos_token=True))


@pytest.mark.slow
@pytest.mark.flag_effect("--add-bos-token")
def test_generate_and_validate_agree_with_training(tmp_path, monkeypatch):
    """A checkpoint trained with --add-bos-token: shard-validate reads bos-first samples (its task
    comes from the checkpoint) and shard-generate's prompt starts with bos too."""
    from shardtrain.cli import generate, train, validate
    from st_testutils import make_space_data_bin, tiny_model_flags

    data_bin, save = make_space_data_bin(str(tmp_path)), tmp_path / "ck"
    train.main([data_bin, *tiny_model_flags(), "--add-bos-token", "--max-update", "1", "--save-dir", str(save),
                "--disable-validation"])
    seen = {}
    real_search = generate.beam_search  # the default: --beam 5
    monkeypatch.setattr(generate, "beam_search", lambda model, prompt, *a, **k: (
        seen.setdefault("prompt", prompt.tolist()), real_search(model, prompt, *a, **k))[1])
    real_load = validate.load_for_inference
    monkeypatch.setattr(validate, "load_for_inference", lambda *a, **k: (
        lambda loaded: (seen.setdefault("task", loaded[1]), loaded)[1])(real_load(*a, **k)))
    generate.main([data_bin, "--path", f"{save}/checkpoint_last.pt", "--prompt", "w1 w2", "--max-len", "2", "--cpu"])
    validate.main([data_bin, "--path", f"{save}/checkpoint_last.pt", "--cpu"])
    task = seen["task"]
    bos = task.dictionary.bos()
    assert seen["prompt"][:2] == [bos, task.dictionary.eos()]
    assert task.cfg.add_bos_token and task.datasets["valid"][0]["source"][0].item() == bos
