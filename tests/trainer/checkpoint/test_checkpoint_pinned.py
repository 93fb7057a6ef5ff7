"""A reader resolves a checkpoint name once and reads, and verifies, only what it named then: an alias
(checkpoint_last) re-pointed, or a file replaced, by a run saving meanwhile never mixes two checkpoints."""
import logging
import os
import shutil

import pytest
import torch

from shardtrain.cli import consolidate, train
from shardtrain.trainer.checkpoint.sharded import ShardedDirectory
from shardtrain.trainer.checkpoint.single_file import SingleFile
from st_testutils import small_data_bin, tiny_model_flags, train_both_forms

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return small_data_bin(str(tmp_path_factory.mktemp("pinned")))


@pytest.fixture(scope="module")
def saves(data_bin, tmp_path_factory):
    """{backend: save dir with checkpoints at updates 2 and 4, checkpoint_last the second}."""
    return train_both_forms(data_bin, tmp_path_factory.mktemp("saves"), "--max-update", "4",
                            "--save-interval-updates", "2")


def swap_after(monkeypatch, fmt, method, swap):
    """``fmt.method`` runs ``swap()`` right after itself: a run publishing a new checkpoint at that moment."""
    original = getattr(fmt, method)

    def then_swap(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        swap()
        return result
    monkeypatch.setattr(fmt, method, then_swap)


def repoint(link, target):
    os.remove(link)
    os.symlink(target, link)


@pytest.mark.parametrize("method", ["verify", "read_verified_state"])
def test_consolidating_checkpoint_last_while_it_is_repointed_reads_one_checkpoint(method, saves, tmp_path,
                                                                                   monkeypatch):
    save = tmp_path / "save"
    shutil.copytree(saves["fully_sharded"], save, symlinks=True)
    assert os.readlink(save / "checkpoint_last") == "checkpoint_1_4"
    whole = {}
    for name in ("checkpoint_1_2", "checkpoint_1_4"):  # each checkpoint read alone, for comparison
        consolidate.main([str(save / name), str(tmp_path / f"{name}.pt")])
        whole[name] = torch.load(tmp_path / f"{name}.pt", weights_only=True)
    assert not torch.equal(whole["checkpoint_1_2"]["model"]["embed_tokens.weight"],
                           whole["checkpoint_1_4"]["model"]["embed_tokens.weight"])
    swap_after(monkeypatch, ShardedDirectory, method, lambda: repoint(save / "checkpoint_last", "checkpoint_1_2"))
    consolidate.main([str(save / "checkpoint_last"), str(tmp_path / "out.pt")])
    out = torch.load(tmp_path / "out.pt", weights_only=True)
    assert out["train_state"]["num_updates"] == 4  # what checkpoint_last named when the reading began
    for part in ("model", "optimizer"):
        assert same(out[part], whole["checkpoint_1_4"][part]), part


def same(a, b) -> bool:
    """Equal nested state: tensors element for element."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def test_resuming_from_a_file_replaced_after_its_verification_reads_the_verified_one(data_bin, saves, tmp_path,
                                                                                      monkeypatch, caplog):
    save = tmp_path / "save"
    shutil.copytree(saves["pytorch_ddp"], save)
    older = save / "checkpoint_1_2.pt"

    def replace():  # as a save does: a new file renamed over the name
        shutil.copyfile(older, save / "tmp")
        os.replace(save / "tmp", save / "checkpoint_last.pt")
    swap_after(monkeypatch, SingleFile, "verify", replace)
    with caplog.at_level(logging.INFO):
        train.main([data_bin, *tiny_model_flags(), "--cpu", "--max-update", "5", "--save-dir", str(save),
                    "--log-format", "none"])
    loaded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded checkpoint")]
    assert loaded and f"{save}/checkpoint_last.pt (epoch 1 @ 4 updates)" in loaded[0], loaded


def test_resuming_from_a_sharded_alias_repointed_after_its_verification(data_bin, saves, tmp_path, monkeypatch,
                                                                        caplog):
    save = tmp_path / "save"
    shutil.copytree(saves["fully_sharded"], save, symlinks=True)
    swap_after(monkeypatch, ShardedDirectory, "verify", lambda: repoint(save / "checkpoint_last", "checkpoint_1_2"))
    with caplog.at_level(logging.INFO):
        train.main([data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", "fully_sharded", "--max-update", "5",
                    "--save-dir", str(save), "--log-format", "none"])
    loaded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded checkpoint")]
    assert loaded and f"{save}/checkpoint_last (epoch 1 @ 4 updates)" in loaded[0], loaded
