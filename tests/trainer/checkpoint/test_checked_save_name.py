"""The NaN stop names the last checkpoint checked finite as what it is on disk: a sharded checkpoint is a
directory (``checkpoint_1_3``, no ``.pt``), a single-file one a file."""
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.checkpoint.manager import CheckpointManager
from shardtrain.trainer.checkpoint.sharded import ShardedDirectory
from shardtrain.trainer.checkpoint.single_file import SingleFile
from shardtrain.trainer.precision.diverged import diverged_at


class _Sharded(ShardedDirectory):
    def save(self, options, names, header, parts, epoch, updates, is_master, prepare):
        return [f"{options.save_dir}/checkpoint_{epoch}_{updates}"]  # what the real one returns, unwritten


class _SingleFile(SingleFile):
    def save(self, options, names, header, parts, epoch, updates, is_master, prepare):
        return [f"{options.save_dir}/{name}" for name in names]


def _named(tmp_path, fmt) -> str:
    manager = CheckpointManager(parse_train_args(["data-bin", "--save-dir", str(tmp_path)]).checkpoint)
    manager.format = fmt
    manager.save({}, {}, 1, 3, ["checkpoint_1_3.pt", "checkpoint_last.pt"])
    return str(diverged_at(5, 0).naming(manager.last_checked_save))


def test_a_sharded_checkpoint_is_named_as_a_directory(tmp_path):
    named = _named(tmp_path, _Sharded())
    assert "the last checkpoint this run saved, the directory checkpoint_1_3 of update 3, was checked finite" in named
    assert ".pt" not in named


def test_a_single_file_checkpoint_is_named_as_its_file(tmp_path):
    named = _named(tmp_path, _SingleFile())
    assert "the last checkpoint this run saved, checkpoint_1_3.pt of update 3, was checked finite" in named
