"""Entry points run on every rank by test_optimizers_sharded (importable by spawned children)."""
import numpy as np
import torch

from equivalence_mains import train_and_record  # noqa: F401 - an entry for run_each
from shardtrain.trainer import build
from shardtrain.trainer.resolved import Components
from shardtrain.trainer.loop import Run, train
from shardtrain.trainer.checkpoint.sharded import load_sharded_into
from shardtrain.trainer.checkpoint.sharded_saver import ShardedSaver


def run_each(jobs, cfg, ctx):
    """Run every ``(entry function, config)`` of ``jobs`` in turn, in this one process group
    (starting ranks costs seconds; ``cfg`` only started them); rank 0 returns their results."""
    return [entry(job_cfg, ctx) for entry, job_cfg in jobs]


def train_and_reload_optimizer(cfg, ctx):
    """Train, then load the optimizer's state into a freshly built optimizer as a resume
    does: through a sharded checkpoint under fully_sharded, else the state dict.

    Rank 0 returns (the full weights, the full optimizer state, the same after the
    reload, the largest change the reload made to any weight), as numpy. On a fresh optimizer,
    torch.distributed.checkpoint first steps it with zero gradients and lr 0 to
    create the state it loads into; that step must not move the weights.
    """
    run = Run(cfg, ctx)
    try:
        train(run)
        trainer, backend = run.trainer, run.backend
        saved = backend.optimizer_state_dict(trainer.model, trainer.optimizer)  # full, on rank 0
        before = backend.model_state_dict(trainer.model)
        fresh = build.build_optimizer(cfg, Components.of(cfg), trainer.params, backend.optimizer_device)
        if backend.sharded_checkpoints:
            path = ShardedSaver().save(cfg.checkpoint.save_dir, f"reload{ctx.world_size}", trainer.model,
                                       trainer.optimizer, extra={}, aliases=[])
            load_sharded_into(path, trainer.model, fresh)
        else:
            backend.load_optimizer_state_dict(trainer.model, fresh, saved)
        reloaded = backend.optimizer_state_dict(trainer.model, fresh)
        after = backend.model_state_dict(trainer.model)
    finally:
        run.close()
    if not ctx.is_master:
        return None
    moved = max(float((after[k].float() - before[k].float()).abs().max()) for k in before)
    weights = {k: v.float().numpy() for k, v in before.items()}
    return weights, _numpy_state(saved), _numpy_state(reloaded), moved


def initial_weights(cfg, ctx):
    """The weights every run starts from (the seed's), before any update."""
    run = Run(cfg, ctx)
    try:
        weights = run.backend.model_state_dict(run.trainer.model)
    finally:
        run.close()
    return {k: v.float().numpy() for k, v in weights.items()} if ctx.is_master else None


def _numpy_state(state_dict):
    return {name: {k: np.asarray(v.float()) if torch.is_tensor(v) else v for k, v in values.items()}
            for name, values in state_dict["state"].items()}
