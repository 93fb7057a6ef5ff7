"""--no-save-optimizer-state (fairseq 0.12.2 CheckpointConfig: "don't save optimizer-state as part of
checkpoint"): the checkpoint holds no optimizer state, in a single file and in a sharded directory
(2 gloo ranks); resuming from it starts a fresh optimizer with a notice while the rest resumes."""
import os

import pytest
import torch

from shardtrain.cli import train
from st_testutils import last_checkpoint_state, make_space_data_bin, tiny_model_flags

TESTS_ROOM = "shardtrain.trainer.checkpoint"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("data")))


def _train(data_bin, save, ranks, backend, max_update, capfd, *extra):
    """In this process (spawned ranks print to the same file descriptors, which capfd reads)."""
    train.main([data_bin, *tiny_model_flags(), "--cpu", "--save-dir", str(save), "--max-update", str(max_update),
                "--disable-validation", "--distributed-world-size", str(ranks), "--ddp-backend", backend, *extra])
    out, err = capfd.readouterr()
    return out + err


def _optimizer_entries(save) -> list:
    """The optimizer's entries in checkpoint_last: the single file's key, or a sharded directory's DCP keys."""
    sharded = os.path.join(save, "checkpoint_last")
    if os.path.isdir(sharded):
        from torch.distributed.checkpoint import FileSystemReader
        keys = FileSystemReader(os.path.realpath(sharded)).read_metadata().state_dict_metadata
        return [k for k in keys if k.startswith("optimizer")]
    return [k for k in torch.load(sharded + ".pt", weights_only=False) if k == "optimizer"]


@pytest.mark.flag_effect("--no-save-optimizer-state")
@pytest.mark.parametrize("ranks,backend", [(1, "pytorch_ddp"), (2, "fully_sharded")])
def test_no_optimizer_state_saved_and_resume_starts_it_fresh(data_bin, tmp_path, ranks, backend, capfd):
    save = tmp_path / "save"
    _train(data_bin, save, ranks, backend, 2, capfd, "--no-save-optimizer-state")
    assert _optimizer_entries(save) == []
    log = _train(data_bin, save, ranks, backend, 4, capfd)
    assert "was saved with --no-save-optimizer-state: the optimizer starts fresh" in log
    assert last_checkpoint_state(save)["train_state"]["num_updates"] == 4
    assert _optimizer_entries(save)  # the resumed run saves its optimizer again: the check sees it when there
