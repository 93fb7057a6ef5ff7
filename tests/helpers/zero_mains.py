"""Entry points run on every rank by the ZeRO tests (importable by spawned children).

One spawn trains several configs in turn in the same process group, because
each spawn of 2 ranks costs seconds.
"""
import functools

import torch
import torch.distributed as dist

from equivalence_mains import record_steps
from shardtrain.core.errors import ConfigError
from shardtrain.optim.registry import OptimizerSpec
from shardtrain.trainer.metrics.logging_setup import setup_logging
from shardtrain.trainer.loop import Run, train
from shardtrain.trainer.metrics.state_memory import state_bytes
from shardtrain.trainer.parallel.zero import ShardedStateOptimizer


def record(cfg, ctx):
    """Train through the real loop. Rank 0 returns the per-update losses, gradient norms and
    whether each update was clipped, the final weights, the optimizer's class and every
    rank's optimizer-state bytes."""
    setup_logging(cfg.common.log_file, ctx.rank)  # as loop.main: this run's --log-file
    run = Run(cfg, ctx)
    steps = record_steps(run.trainer)
    try:
        train(run)
        held = state_bytes(run.trainer.params, run.trainer.optimizer)["optim_bytes"]
        weights = run.backend.model_state_dict(run.trainer.model)
    finally:
        run.close()
    every = [held]
    if ctx.world_size > 1:
        every = [None] * ctx.world_size
        dist.all_gather_object(every, held)
    if not ctx.is_master:
        return None
    return {**steps, "weights": {k: v.float().numpy() for k, v in weights.items()},
            "optim_bytes": every, "optimizer": type(run.trainer.optimizer).__name__}


def too_few_tensors_error() -> str:
    """The error for more ranks than parameter tensors to give them."""
    try:
        ShardedStateOptimizer([torch.nn.Parameter(torch.zeros(3))], OptimizerSpec(torch.optim.SGD, {}), 0.1)
    except ConfigError as e:
        return str(e)
    return ""


def record_each(cfgs, cfg, ctx):
    """``record`` for each of ``cfgs`` in turn (``cfg``: the first one, which call_main launched with)."""
    results = [record(c, ctx) for c in cfgs]
    error = too_few_tensors_error() if ctx.world_size > 1 else ""
    return (results, error) if ctx.is_master else None


def record_all(cfgs):
    """A picklable main that trains ``cfgs`` in one spawn."""
    return functools.partial(record_each, cfgs)
