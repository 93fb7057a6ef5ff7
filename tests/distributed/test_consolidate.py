"""shard-consolidate: sharded directory <-> single file, without the world size that saved it."""
import numpy as np
import pytest
import torch

from shardtrain.cli import consolidate, validate
from shardtrain.config.build import from_dict
from shardtrain.models.transformer_lm import TransformerLanguageModel
from test_sharded_checkpoints import HALF, TOTAL, run
from st_testutils import make_space_data_bin


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("consolidate")
    data = make_space_data_bin(str(root), n_words=8, train_tokens=8000, valid_tokens=400, line_len=40)
    _, weights, _ = run(data, root / "ck", 2, HALF)  # rank 0 returns the full weights it trained
    return data, root / "ck", weights


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


def test_full_state_round_trip_resumes_like_the_original(trained, tmp_path):
    data, ck, _ = trained
    full = tmp_path / "full.pt"
    consolidate.main([str(ck / "checkpoint_last"), str(full)])
    state = torch.load(full, weights_only=True)
    assert {"model", "optimizer", "lr_scheduler", "train_iterator", "train_state"} <= set(state)
    back = tmp_path / "resharded"
    consolidate.main([str(full), str(back)])
    resumed_from_original = run(data, _copy(ck, tmp_path / "a"), 2, TOTAL)[0]
    resumed_from_round_trip = run(data, tmp_path / "b", 2, TOTAL, "fully_sharded", "0", "--restore-file", str(back))[0]
    np.testing.assert_allclose(resumed_from_round_trip, resumed_from_original, rtol=1e-6)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst
