"""shard-consolidate: sharded directory <-> single file, without the world size that saved it."""
import sys

import numpy as np
import pytest
import torch

from shardtrain.cli import consolidate, validate
from shardtrain.config.run_config import from_dict
from shardtrain.models.transformer_lm import TransformerLanguageModel
import sharded_story

TESTS_ROOM = "shardtrain.trainer.checkpoint"  # it drives the commands: its imports cannot say which room it tests

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The 2-rank sharded checkpoint test_sharded_checkpoints.py resumes (made once: sharded_story.py)."""
    first = sharded_story.first_halves(tmp_path_factory)
    return first["data"], first["dirs"]["two"], first["results"]["two"][1]  # rank 0 returns the full weights


def test_model_only_file_loads_into_a_plain_module(trained, tmp_path):
    data, ck, weights = trained
    out = tmp_path / "model.pt"
    consolidate.main([str(ck / "checkpoint_last"), str(out), "--model-only"])
    state = torch.load(out, weights_only=True)
    assert set(state) == {"version", "cfg", "task_fingerprint", "model"}
    cfg = from_dict(state["cfg"])
    model = TransformerLanguageModel(cfg.model, vocab_size=16, padding_idx=1, max_positions=16)
    model.load_state_dict(state["model"])  # strict: every key, every shape
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), weights[k])
    # shard-validate reads either form and gets the same loss
    from_dir = validate.main([data, "--path", str(ck / "checkpoint_last"), "--cpu"])
    from_file = validate.main([data, "--path", str(out), "--cpu"])
    assert from_dir["valid"]["loss"] == from_file["valid"]["loss"]


@pytest.mark.flag_effect("--restore-file")
def test_full_state_round_trip_resumes_like_the_original(tmp_path_factory):
    """sharded_story.first_halves converted the checkpoint to a full-state file and back (shard-consolidate
    both ways); the resumes from the original and from the round trip ran in one spawn."""
    first = sharded_story.first_halves(tmp_path_factory)
    state = torch.load(first["full"], weights_only=True)
    assert {"model", "optimizer", "lr_scheduler", "train_iterator", "train_state"} <= set(state)
    resumed = sharded_story.resumes(tmp_path_factory)
    np.testing.assert_allclose(resumed["round_trip"], resumed["two"], rtol=1e-6)


# Output handling: every direction refuses an existing output unless --overwrite, and a bad
# output path is one paragraph (exit 2) found before anything is read or written.

TINY = ["--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim",
        "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16", "--batch-size", "8", "--cpu",
        "--max-update", "1", "--log-format", "none", "--no-epoch-checkpoints", "--disable-validation"]


@pytest.fixture(scope="module")
def one_file(tmp_path_factory):
    """A full-state single-file checkpoint of a tiny model (one process, one update)."""
    from shardtrain.cli import train

    root = tmp_path_factory.mktemp("one_file")
    train.main([sharded_story.data_bin(tmp_path_factory), *TINY, "--save-dir", str(root / "ck")])
    return root / "ck" / "checkpoint_last.pt"


def error_of(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        consolidate.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("shard-consolidate: error: ") and err.count("\n") == 1
    return err


def listing(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_existing_outputs_are_refused_in_every_direction_unless_overwrite(one_file, tmp_path, capsys):
    sharded = tmp_path / "sharded"
    consolidate.main([str(one_file), str(sharded)])
    kept = tmp_path / "kept.pt"
    kept.write_text("precious")
    for flags in ([], ["--model-only"]):
        err = error_of(capsys, [str(sharded), str(kept), *flags])
        assert "exists" in err and "--overwrite" in err and "nothing was overwritten" in err
    assert kept.read_text() == "precious"
    consolidate.main([str(sharded), str(kept), "--model-only", "--overwrite"])
    assert set(torch.load(kept, weights_only=True)) == {"version", "cfg", "task_fingerprint", "model"}

    err = error_of(capsys, [str(kept), str(sharded)])  # file -> an existing directory
    assert "exists" in err and "--overwrite" in err
    consolidate.main([str(kept), str(sharded), "--overwrite"])  # now the model-only form
    assert "optimizer" not in torch.load(tmp_path / "sharded" / "extra.pt", weights_only=True)
    assert not [p for p in listing(tmp_path) if ".partial" in p or p.endswith(".tmp")]

    # --overwrite replaces a sharded checkpoint, never another directory or a file of the other kind
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep")
    err = error_of(capsys, [str(kept), str(other), "--overwrite"])
    assert "not a sharded checkpoint directory" in err
    err = error_of(capsys, [str(kept), str(kept), "--overwrite"])
    assert "is not a directory" in err
    assert (other / "todo.txt").read_text() == "keep" and listing(other) == ["todo.txt"]


def test_bad_output_paths_are_one_paragraph_before_anything_is_written(one_file, tmp_path, capsys, monkeypatch):
    sharded = tmp_path / "sharded"
    consolidate.main([str(one_file), str(sharded)])
    before = listing(tmp_path)
    for argv, words in (
            ([str(sharded), str(tmp_path / "nodir" / "out.pt")], "does not exist; create it first"),
            ([str(one_file), str(tmp_path / "nodir" / "outdir")], "does not exist; create it first"),
            ([str(sharded), str(tmp_path)], "is a directory"),
            ([str(sharded), str(tmp_path), "--overwrite"], "is a directory"),
            ([str(sharded), str(tmp_path / "new") + "/"], "names a directory")):
        assert words in error_of(capsys, argv)
    # safetensors is checked before OUTPUT is written (here: as if it were not installed)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    err = error_of(capsys, [str(sharded), str(tmp_path / "st.pt"), "--model-only", "--export-safetensors"])
    assert "pip install safetensors" in err
    assert listing(tmp_path) == before


def test_log_names_what_was_written(one_file, tmp_path, capsys):
    model_only = tmp_path / "model.pt"
    consolidate.main([str(one_file), str(tmp_path / "full")])
    assert "(full training state)" in capsys.readouterr().out
    consolidate.main([str(tmp_path / "full"), str(model_only), "--model-only"])
    consolidate.main([str(model_only), str(tmp_path / "from_model_only")])
    consolidate.main([str(tmp_path / "from_model_only"), str(tmp_path / "back.pt")])
    out = capsys.readouterr().out
    assert "full training state" not in out and out.count("no optimizer or training state") == 2
