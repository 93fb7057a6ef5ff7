"""A one-process run's process group: started by the run (launch's OneRankGroup) when its backend class
needs one (fully_sharded's mesh), never by the backend; ended with the run, and on a failed start."""
import pytest
import torch
import torch.distributed as dist

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.trainer.launch.one_rank_group import OneRankGroup
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.loop import Run
from st_testutils import make_space_data_bin, tiny_model_flags

ONE_RANK = make_context(0, 0, 1, use_cuda=False, backend=None)


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("group")), train_tokens=400, valid_tokens=100)


def group_while_running(data_bin, save_dir, backend: str):
    """(the group while the run holds it: False, or its world size and backend; whether one is left after)."""
    cfg = parse_train_args([data_bin, "--cpu", "--save-dir", str(save_dir), "--ddp-backend", backend,
                            *tiny_model_flags()])
    run = Run(cfg, ONE_RANK)
    try:
        during = dist.is_initialized() and (dist.get_world_size(), dist.get_backend())
    finally:
        run.close()
    return during, dist.is_initialized()


def test_fully_sharded_gets_a_one_rank_gloo_group_for_the_run_only(data_bin, tmp_path):
    assert group_while_running(data_bin, tmp_path / "fsdp", "fully_sharded") == ((1, "gloo"), False)


def test_a_backend_that_needs_no_group_gets_none(data_bin, tmp_path):
    assert group_while_running(data_bin, tmp_path / "ddp", "pytorch_ddp") == (False, False)


def test_a_run_that_fails_to_start_ends_its_group(data_bin, tmp_path):
    # 1 rank in shard groups of 3: the backend refuses its mesh after the group was started
    cfg = parse_train_args([data_bin, "--cpu", "--save-dir", str(tmp_path), "--ddp-backend", "fully_sharded",
                            "--fsdp-sharding-strategy", "hybrid_shard", "--shard-group-size", "3",
                            *tiny_model_flags()])
    with pytest.raises(ConfigError, match="--shard-group-size 3"):
        Run(cfg, ONE_RANK)
    assert not dist.is_initialized()


def test_a_group_that_exists_is_left_alone(one_rank_group):
    group = OneRankGroup(torch.device("cpu"))
    group.close()
    assert dist.is_initialized()  # the fixture's group: it ends it
