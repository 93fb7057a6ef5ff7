"""shard-consolidate --model-only from either form (issue 37, item 4): docs/checkpoints.md's command after a
single-process run (checkpoint_last.pt, one file) and after a fully_sharded one (the directory checkpoint_last,
also found as checkpoint_last.pt) writes the same thing: a file whose top-level keys are the header and the
model's weights under "model", which load strictly into a plain module."""
import os

import pytest
import torch

from shardtrain.cli import consolidate
from shardtrain.models.transformer_lm import TransformerLanguageModel
from shardtrain.config.run_config import from_dict
from shardtrain.trainer.checkpoint.consolidate import read_sharded
from st_testutils import small_data_bin, train_both_forms

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

MODEL_ONLY_KEYS = {"version", "cfg", "task_fingerprint", "model"}  # as docs/checkpoints.md lists them


@pytest.fixture(scope="module")
def saves(tmp_path_factory):
    root = tmp_path_factory.mktemp("model_only")
    return train_both_forms(small_data_bin(str(root)), root, "--max-update", "1")


def trained_weights(save_dir):
    last = os.path.join(save_dir, "checkpoint_last")
    if os.path.isdir(last):
        return read_sharded(last, model_only=True)["model"]
    return torch.load(last + ".pt", weights_only=True)["model"]


FORMS = [("pytorch_ddp", "checkpoint_last.pt"), ("fully_sharded", "checkpoint_last.pt"),
         ("fully_sharded", "checkpoint_last")]  # (the run's backend, the name passed)


@pytest.mark.parametrize("backend,name", FORMS)
def test_the_docs_command_works_on_either_form_and_writes_the_same_keys(saves, backend, name, tmp_path):
    out = tmp_path / "model.pt"
    consolidate.main([os.path.join(saves[backend], name), str(out), "--model-only"])
    state = torch.load(out, weights_only=True)
    assert set(state) == MODEL_ONLY_KEYS
    cfg = from_dict(state["cfg"])
    module = TransformerLanguageModel(cfg.model, vocab_size=len(state["model"]["embed_tokens.weight"]),
                                      padding_idx=1, max_positions=cfg.task.tokens_per_sample)
    module.load_state_dict(state["model"])  # strict: every key, every shape
    expected = trained_weights(saves[backend])
    assert sorted(state["model"]) == sorted(expected)
    for key, value in expected.items():
        assert torch.equal(state["model"][key], value), key


def test_a_single_file_without_model_only_still_converts_whole_to_a_directory(saves, tmp_path, capsys):
    single = os.path.join(saves["pytorch_ddp"], "checkpoint_last.pt")
    consolidate.main([single, str(tmp_path / "sharded")])
    assert os.path.isfile(tmp_path / "sharded" / "COMPLETE") and "(full training state)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # safetensors are written beside one output file only
        consolidate.main([single, str(tmp_path / "st"), "--export-safetensors"])
    assert e.value.code == 2 and "add --model-only to export its weights" in capsys.readouterr().err
    assert not os.path.lexists(tmp_path / "st")
