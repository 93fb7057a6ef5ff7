"""Entry points for test_async_save_cpu (importable by spawned children): an async save
whose live state is changed in place the moment ``save()`` returns."""
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from shardtrain.trainer.loop import Run, train
from shardtrain.trainer.sharded_checkpoints import ShardedSaver, load_sharded_into


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
    """What the next optimizer step does to a checkpoint in flight: change every
    parameter, moment and step count in place (alike on every rank: replicated
    tensors such as the step are written by one rank and must stay equal)."""
    for tensor in live_tensors(model, optimizer).values():
        if tensor.is_floating_point():
            tensor.add_(1.0)


def worst_difference(expected: dict, actual: dict) -> float:
    """Largest |difference| over every rank (a collective)."""
    worst = max(float((expected[k].double() - actual[k].double()).abs().max()) for k in expected)
    worst = torch.tensor(worst, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def save_mutate_load(cfg, ctx):
    """Two async saves, each followed at once by an in-place change of the live state.
    Returns (worst difference of each loaded checkpoint from the state at its save(),
    stagers the saver created, whether the second save staged into the first's buffers)."""
    run = Run(cfg, ctx)
    try:
        train(run)
        model, optimizer, save_dir = run.trainer.model, run.trainer.optimizer, cfg.checkpoint.save_dir
        saver = ShardedSaver(async_save=True)
        differences, staged = [], []
        for i in range(2):
            before = snapshot(model, optimizer)
            path = saver.save(save_dir, f"torn{i}", model, optimizer, extra={}, aliases=[])
            staged.append(saver.stager.get(None))
            mutate(model, optimizer)  # training goes on while the write is in the background
            saver.wait()
            mutated = snapshot(model, optimizer)
            load_sharded_into(path, model, optimizer)
            differences.append(worst_difference(before, snapshot(model, optimizer)))
            live = live_tensors(model, optimizer)  # put training's state back
            for key, value in mutated.items():
                live[key].copy_(value)
        created = saver.stager.created
        saver.close()
    finally:
        run.close()
    return differences, created, staged[0] is staged[1]
