"""Issue 37 item 5: a one-process fully_sharded run's 1-rank group (launch/one_rank_group.py) met through a
file in a fresh temporary directory, and left that directory behind, empty, at every run."""
import os
import tempfile

import torch.distributed as dist

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.loop import Run
from st_testutils import make_space_data_bin, tiny_model_flags


def test_a_one_rank_fully_sharded_run_leaves_no_temporary_directory(tmp_path, monkeypatch):
    data_bin = make_space_data_bin(str(tmp_path / "data"), train_tokens=400, valid_tokens=100)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    cfg = parse_train_args([data_bin, "--cpu", "--save-dir", str(tmp_path / "ck"), "--ddp-backend", "fully_sharded",
                            *tiny_model_flags()])
    run = Run(cfg, make_context(0, 0, 1, use_cuda=False, backend=None))
    try:
        during = ours(temp)
        assert dist.is_initialized() and dist.get_world_size() == 1
    finally:
        run.close()
    assert len(during) == 1 and during[0].startswith("shardtrain-pg-")  # the group's, while it lives
    assert ours(temp) == []


def ours(temp):
    """shardtrain's entries (torch may add its own caches there, torchinductor_USER)."""
    return sorted(name for name in os.listdir(temp) if name.startswith("shardtrain"))
