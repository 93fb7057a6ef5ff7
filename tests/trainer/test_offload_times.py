"""Where an update's time goes when the optimizer steps in host memory beside sharded parameters
(trainer/offload_times.py): the split from written-down stretches, and a real fully_sharded + cpu_adam step
whose blocks' backward sleeps (an accelerator's kernels), stepping during backward and after it."""
import time
import types

import pytest
import torch

from shardtrain.data.collate import collate
from shardtrain.trainer import offload_times
from shardtrain.trainer.metrics.run_metrics import RunMetrics
from shardtrain.trainer.parallel.base import unwrap
from small_trainer import blocks, make_trainer
from st_testutils import make_space_data_bin

FIELDS = ["offload_fwd_bwd", "offload_upload", "offload_grad_wait", "offload_cpu_step", "offload_step_exposed",
          "offload_hidden"]


def test_the_split_from_written_down_stretches(monkeypatch):
    clock = offload_times.StepClock()
    times = offload_times.OffloadTimes(torch.nn.Linear(2, 2), clock)  # no FSDP module: nothing unsharded
    now = iter([0.5, 4.0, 5.5])
    monkeypatch.setattr(offload_times.time, "perf_counter", lambda: next(now))
    clock.worked(0.0, 0.2)   # the update before's: not this one's
    clock.waited(9.0)
    times.unshards.seconds = 7.0
    times.begin()            # 0.5
    clock.worked(1.0, 2.0)   # under backward
    clock.waited(0.25)
    clock.worked(2.5, 3.5)   # under backward
    times.backward_done()    # 4.0
    clock.worked(3.75, 5.0)  # a quarter under backward, the rest after it
    fields = times.fields()  # 5.5
    assert fields == {"offload_fwd_bwd": 3.5, "offload_upload": 0.0, "offload_grad_wait": 0.25,
                      "offload_cpu_step": 3.25, "offload_step_exposed": 1.5,
                      "offload_hidden": 100.0 * 2.25 / 3.25}
    assert clock.take() == ([], 0.0)  # taken: the next update starts from nothing


class _OnTheDevice(torch.nn.Module):
    """A model whose (sharded) parameter's mesh is an accelerator's, its shard in host memory."""

    def parameters(self, recurse=True):
        yield types.SimpleNamespace(device_mesh=types.SimpleNamespace(device_type="cuda"),
                                    device=torch.device("cpu"))


def test_upload_on_an_accelerator_is_the_uploaders_copies():
    model, timed = _OnTheDevice(), iter([9.0, 0.75])
    offload_times.attach_upload_timer(model, lambda: next(timed))
    times = offload_times.OffloadTimes(model, offload_times.StepClock())
    times.begin()  # takes the 9 s of uploads before the update
    times.backward_done()
    assert times.fields()["offload_upload"] == 0.75


def test_upload_is_left_out_on_an_accelerator_without_an_uploader():
    """FSDP2's own non-blocking copies: its hook's host time is not theirs."""
    times = offload_times.OffloadTimes(_OnTheDevice(), offload_times.StepClock())
    times.begin()
    times.backward_done()
    fields = times.fields()
    assert "offload_upload" not in fields and sorted(fields) == sorted(set(FIELDS) - {"offload_upload"})


BLOCKS = 4
SLEEP = 0.1


class _SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SLEEP)  # the accelerator computing this block's backward: the CPU is free
        return grad


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("times")))


def _records(data_bin, *flags):
    trainer, task = make_trainer(data_bin, "--ddp-backend", "fully_sharded", "--optimizer", "cpu_adam",
                                 "--decoder-layers", str(BLOCKS), "--clip-norm", "0", "--cpu-step", "during-backward",
                                 *flags)
    for block in unwrap(trainer.model).blocks:
        block.forward = lambda x, *a, _f=block.forward, **k: _f(_SleepInBackward.apply(x), *a, **k)
    batch = [collate(blocks(task, range(4)), task.dictionary.pad())]
    metrics = RunMetrics(torch.device("cpu"), trainer)
    outs = []
    for _ in range(3):
        metrics.begin_update()
        outs.append(trainer.train_step(batch))
        metrics.end_update()
        metrics.log_update(trainer.criterion, outs[-1], trainer.num_updates)
    record = metrics.stats(metrics.inner, trainer.num_updates, "train_inner")
    return trainer, [o["offload"] for o in outs], record


def test_every_record_splits_the_update_and_the_step_hides_under_backward(one_rank_group, data_bin):
    trainer, splits, record = _records(data_bin)
    assert trainer.step_in_backward is not None
    for split in splits:
        assert sorted(split) == sorted(FIELDS)
        assert split["offload_fwd_bwd"] >= BLOCKS * SLEEP  # the blocks' backward is in it
        assert 0 < split["offload_upload"] < split["offload_fwd_bwd"]  # FSDP2's gathers before each forward
        assert split["offload_grad_wait"] == 0.0  # gradients on the host as they are made: nothing to wait for
        assert split["offload_cpu_step"] > 0
        # every block's shards stepped while an earlier block slept in backward; FSDP's root (embeddings)
        # reduces last, the only work that may end after backward
        assert split["offload_hidden"] > 25.0, split
    mean = sum(s["offload_hidden"] for s in splits) / len(splits)
    assert record["offload_hidden"] == round(mean, 1)  # the record's: the window's mean, in percent
    assert all(k in record for k in FIELDS)


@pytest.mark.flag_effect("--cpu-step")
def test_stepping_after_backward_hides_nothing(one_rank_group, data_bin):
    trainer, splits, _ = _records(data_bin, "--cpu-step", "after-backward")
    assert trainer.step_in_backward is None
    for split in splits:
        assert split["offload_hidden"] == 0.0
        assert split["offload_step_exposed"] >= split["offload_cpu_step"] > 0


def test_other_backends_record_no_split(one_rank_group, data_bin):
    trainer, _ = make_trainer(data_bin, "--ddp-backend", "pytorch_ddp", "--optimizer", "cpu_adam", "--clip-norm", "0")
    assert trainer.times is None
    out = trainer.train_step([collate(blocks(trainer.task, range(2)), trainer.task.dictionary.pad())])
    assert "offload" not in out


def test_upload_is_the_time_in_fsdps_pre_forward_unshards(one_rank_group, data_bin, monkeypatch):
    """Each unshard made slower by a written-down 20 ms: the forward's (one per block and the root) are counted
    in offload_upload, backward's re-gathers are not (they are in offload_fwd_bwd only)."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    unshard = FSDPParamGroup.unshard

    def slow(self, *args, **kwargs):
        time.sleep(0.02)
        return unshard(self, *args, **kwargs)

    monkeypatch.setattr(FSDPParamGroup, "unshard", slow)
    _, splits, _ = _records(data_bin)
    for split in splits:
        assert 0.02 * (BLOCKS + 1) <= split["offload_upload"] < 0.02 * (BLOCKS + 1) + BLOCKS * SLEEP, split


def test_closing_the_trainer_removes_its_hooks(one_rank_group, data_bin):
    """After close() the model carries none of the trainer's hooks: no shard is handed to the worker during
    backward (all step on the training thread, at commit) and no unshard is timed."""
    from step_in_backward_mains import counting_step_one
    trainer, splits, _ = _records(data_bin)
    assert all(s["offload_upload"] > 0 for s in splits)
    trainer.close()
    batch = [collate(blocks(trainer.task, range(4)), trainer.task.dictionary.pad())]
    with counting_step_one() as counts:
        out = trainer.train_step(batch)
    assert counts == {"worker": 0, "training": len(trainer.params)}
    assert out["offload"]["offload_upload"] == 0.0
