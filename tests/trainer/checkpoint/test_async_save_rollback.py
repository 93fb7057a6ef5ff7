"""A --spike-rollback while an --async-save is still writing leaves the checkpoint as it was at its save().

Under --cpu (and --cpu-offload) the async save writes parameters and optimizer state from the live
tensors, and only optimizer steps wait for the write. A rollback restores its snapshot into those
tensors outside any step: a NaN update (skipped, so no step waits) that rolled back while the write
of update 6 was in flight published update 4's weights (the snapshot) under update 6's name.

One --cpu process, fully_sharded; every shard write held back WRITE_DELAY s; snapshots every 4
updates; a save at update 6; update 7's loss NaN (skipped by --skip-nan-updates, judged a spike, so
the run rolls back to update 4 at once). The checkpoint of update 6 must equal a run's that saved
synchronously (the rollback came after its save had landed); the run then trains through update 6
again and saves it anew, so the first one is copied aside when it is published.
"""
import functools
import logging
import os
import shutil
import time

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter

from async_save_mains import WRITE_DELAY
from shardtrain.cli import verify as verify_cli
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.checkpoint.sharded import ShardedDirectory, load_extra
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.loop import Run, train
from st_testutils import make_space_data_bin, tiny_model_flags

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]

NAN_CALL = 7  # the 7th update's loss is NaN: after the save of update 6, before update 7
SAVED = "checkpoint_1_6"


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("rollback")), n_words=8, train_tokens=4000)


class NanAt:
    """The run's criterion, with the loss of the ``call``-th update made NaN (as a poisoned batch's can be)."""

    def __init__(self, criterion, trainer, call: int):
        self.criterion, self.call, self.calls = criterion, call, 0
        step = trainer.train_step

        def counted_step(samples):
            self.calls += 1
            return step(samples)

        trainer.train_step = counted_step

    def __getattr__(self, name):
        return getattr(self.criterion, name)

    def __call__(self, model, sample, *args, **kwargs):
        loss, sample_size, log = self.criterion(model, sample, *args, **kwargs)
        if self.calls == self.call:
            loss, log = loss * float("nan"), {**log, "loss": float("nan")}
        return loss, sample_size, log


def nan_at(cfg, ctx, call: int):
    run = Run(cfg, ctx)
    try:
        run.trainer.criterion = NanAt(run.trainer.criterion, run.trainer, call)
        train(run)
        return {"rollbacks": list(run.spikes.rollbacks), "updates": run.trainer.num_updates}
    finally:
        run.close()


def run_keeping_first_save(data_bin, save_dir, monkeypatch, *extra):
    """Train (NaN at NAN_CALL); -> (result, the first SAVED as published, copied aside)."""
    kept = save_dir.parent / f"{save_dir.name}-first-{SAVED}"
    prune = ShardedDirectory.prune

    def prune_keeping_first(self, options):  # rank 0, once a checkpoint is in place
        if os.path.isdir(save_dir / SAVED) and not kept.exists():
            shutil.copytree(save_dir / SAVED, kept)
        prune(self, options)

    monkeypatch.setattr(ShardedDirectory, "prune", prune_keeping_first)
    cfg = parse_train_args([data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", "fully_sharded",
                            "--distributed-world-size", "1", "--max-update", "8", "--save-interval-updates", "6",
                            "--spike-rollback", "--spike-window", "4", "--spike-snapshot-interval", "4",
                            "--skip-nan-updates", "1", "--disable-validation", "--no-epoch-checkpoints",
                            "--save-dir", str(save_dir), "--log-format", "none", *extra])
    result = call_main(cfg, functools.partial(nan_at, call=NAN_CALL))
    return result, kept


def tensors(path) -> dict:
    state = ShardedDirectory().read_tensors(str(path), None, ["model", "optimizer"])
    found = {}

    def walk(prefix, value):
        if torch.is_tensor(value):
            found[prefix] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}/{key}", item)

    walk("", state)
    return found


@pytest.mark.flag_effect("--async-save")
def test_a_rollback_during_an_async_write_leaves_the_checkpoint_whole(data_bin, tmp_path, monkeypatch, caplog):
    reference, synced = run_keeping_first_save(data_bin, tmp_path / "sync", monkeypatch)
    write_data = FileSystemWriter.write_data

    def late_write_data(self, plan, planner):  # the rollback comes while this write is held back
        time.sleep(WRITE_DELAY)
        return write_data(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", late_write_data)
    with caplog.at_level(logging.INFO, logger="shardtrain.trainer.spike"):
        result, written = run_keeping_first_save(data_bin, tmp_path / "async", monkeypatch, "--async-save")
    assert result == reference == {"rollbacks": [NAN_CALL], "updates": 8}  # update 7 (NaN) never counted
    assert load_extra(str(written))["train_state"]["num_updates"] == 6
    got, want = tensors(written), tensors(synced)
    assert got.keys() == want.keys() and len(want) > 10
    assert [k for k in want if not torch.equal(got[k], want[k])] == []  # update 6's state, not update 4's
    assert "the rollback waited for a background checkpoint write" in caplog.text  # the race was on
    for save_dir in (written, tmp_path / "async"):
        with pytest.raises(SystemExit) as exit_info:
            verify_cli.main([str(save_dir)])
            raise SystemExit(0)
        assert exit_info.value.code == 0
