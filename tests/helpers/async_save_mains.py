"""Entry points for test_async_save_cpu (importable by spawned children): async saves
whose live state changes the moment ``save()`` returns."""
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from shardtrain.trainer.checkpoint.async_staging import HostMemory
from shardtrain.trainer.loop import Run, train
from shardtrain.trainer.checkpoint.sharded import load_sharded_into
from shardtrain.trainer.checkpoint.sharded_saver import ShardedSaver

WRITE_DELAY = 1.0  # seconds every shard write is held back, so the next step surely comes first


def live_tensors(model, optimizer) -> dict:
    """This rank's shards of every model and optimizer tensor, by path; they share
    storage with the live state, so changing them changes training's state."""
    found = {}

    def walk(prefix, value):
        if isinstance(value, torch.Tensor):
            found[prefix] = value.to_local() if hasattr(value, "to_local") else value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)

    walk("model", get_model_state_dict(model))
    walk("optimizer", get_optimizer_state_dict(model, optimizer))
    return found


def snapshot(model, optimizer) -> dict:
    return {k: v.detach().clone() for k, v in live_tensors(model, optimizer).items()}


@torch.no_grad()
def mutate(model, optimizer) -> None:
    """Change every parameter, moment and step count in place, outside any optimizer
    step (alike on every rank: replicated tensors such as the step are written by one
    rank and must stay equal)."""
    for tensor in live_tensors(model, optimizer).values():
        if tensor.is_floating_point():
            tensor.add_(1.0)


def worst_difference(expected: dict, actual: dict) -> float:
    """Largest |difference| over every rank (a collective)."""
    worst = max(float((expected[k].double() - actual[k].double()).abs().max()) for k in expected)
    worst = torch.tensor(worst, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


_WRITE_DATA = FileSystemWriter.write_data


def _late_write_data(self, plan, planner):
    time.sleep(WRITE_DELAY)
    return _WRITE_DATA(self, plan, planner)


def slow_writes():
    """Every shard write starts WRITE_DELAY late (this rank process only)."""
    FileSystemWriter.write_data = _late_write_data


SAVES = 3  # the second save is the first to reuse buffers (torch 2.11 crashed there), the third reuses again


class OnAGpu(HostMemory):
    """Staging as on a GPU rank (tests/trainer/checkpoint/cuda_stand_in.py's GpuHostMemory, less its records):
    every tensor counts as on a GPU, so every one is copied, into unpinned buffers (pinning needs a
    GPU); the copies are synchronous here, so there is nothing to wait for."""

    def device_of(self, tensor):
        return torch.device("cuda", 0)

    def allocate(self, like, pinned):
        return torch.empty(like.shape, dtype=like.dtype)

    def synchronize(self, device):
        pass


def buffer_addresses(stager) -> dict:
    return {path: buffer.data_ptr() for path, buffer in stager.buffers().items()}


def save_change_load(cfg, ctx):
    """SAVES async saves of each kind, each followed at once by a change of the live state:
    "split" (a CPU rank's) by a real training update (its optimizer step must wait for the
    write), "copy" (a GPU rank's, OnAGpu: everything copied) by an in-place change outside
    any step (the copy protects it).
    Returns {mode: {"differences": worst |loaded - state at save()| per save,
    "waited": steps that waited for a write, "in_place": bytes written live,
    "copied": bytes copied, "allocations": buffers allocated after each save,
    "addresses": {path: buffer address} after each save, "sources": distinct tensors
    in the state}}."""
    slow_writes()
    run = Run(cfg, ctx)
    results = {}
    try:
        train(run)
        itr = run.batch_iterator("train", 1, shuffle=True).next_epoch_itr()
        model, optimizer, save_dir = run.trainer.model, run.trainer.optimizer, cfg.checkpoint.save_dir
        for mode in ("split", "copy"):
            saver = ShardedSaver(async_save=True)
            if mode == "copy":
                saver.stager.memory = OnAGpu()
            differences, allocations, addresses = [], [], []
            for i in range(SAVES):
                before = snapshot(model, optimizer)
                path = saver.save(save_dir, f"{mode}{i}", model, optimizer, extra={}, aliases=[])
                allocations.append(saver.stager.allocations)
                addresses.append(buffer_addresses(saver.stager))
                if mode == "split":
                    run.trainer.train_step([next(itr)])  # training goes on while the write runs
                else:
                    mutate(model, optimizer)
                saver.wait()
                after = snapshot(model, optimizer)
                load_sharded_into(path, model, optimizer)
                differences.append(worst_difference(before, snapshot(model, optimizer)))
                changed = worst_difference(before, after)
                assert changed > 0, "the change after save() changed nothing: the check would be empty"
                live = live_tensors(model, optimizer)  # put training's state back
                for key, value in after.items():
                    live[key].copy_(value)
            results[mode] = {"differences": differences, "waited": saver.gate.waited,
                             "in_place": saver.stager.in_place_bytes, "copied": saver.stager.copied_bytes,
                             "allocations": allocations, "addresses": addresses,
                             "sources": len({(t.data_ptr(), t.shape, t.dtype)
                                             for t in live_tensors(model, optimizer).values()})}
            saver.close()
            assert saver.stager.buffers() == {}, "close() keeps buffers"
    finally:
        run.close()
    return results
