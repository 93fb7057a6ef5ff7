"""Build a run's training components from the typed config (the trainer only wires them).

The task, model and criterion are built by ``resolved`` (which loading for inference shares);
the optimizer and lr scheduler here, from the classes ``resolved.Components`` looked up once; and the
precision with the model prepared for it (``precision_and_model``), the one assembly ``Run`` and
shard-plan's trace both go through.
"""
import contextlib
import logging
from typing import Callable, Tuple

import torch
from torch import nn
import torch.distributed as dist

from shardtrain.config.epoch_lists import first, numbers
from shardtrain.core.errors import ConfigError
from shardtrain.optim import cpu_adam
from shardtrain.optim.registry import OptimizerSpec
from shardtrain.trainer.parallel.zero_sharding import shards_optimizer_state
from shardtrain.trainer.parallel.prepare import prepare_run_model
from shardtrain.trainer.precision.choose import build_precision, chosen
from shardtrain.trainer.resolved import Components

logger = logging.getLogger(__name__)


def check_best_checkpoint_metric(metric: str, task, criterion) -> None:
    """--best-checkpoint-metric must be one validation logs, or checkpoint_best is never written
    and --patience never fires. A plugin that does not say what it logs is taken on trust."""
    declared = getattr(task, "logged_metrics", None)  # a plugin task need not subclass ours
    logged = declared(criterion) if declared is not None else None
    name = type(criterion).__name__
    if logged is None:
        logger.warning(f"{name} does not declare the metrics it logs (logged_metrics()), so --best-checkpoint-"
                       f"metric {metric} is not checked: if validation never logs it, no checkpoint_best is saved")
    elif metric not in logged:
        raise ConfigError(
            f"--best-checkpoint-metric {metric} is never logged by validation with this --task and --criterion "
            f"({name} logs {', '.join(sorted(logged))}), so checkpoint_best would never be written and --patience "
            f"could never stop the run. Choose one of {', '.join(sorted(logged))}, or a criterion that logs "
            f"{metric}.")


def precision_and_model(cfg, backend, facts, build_model: Callable[[], nn.Module], compile_blocks: bool,
                        preparing=contextlib.nullcontext()) -> Tuple:
    """-> (precision, model): the run's precision, from its facts' precision kind and dtypes (``facts``: the
    run's RunFacts), and its model prepared for training on ``backend`` (``prepare_run_model``: checkpointed as
    the facts say, stored in the precision's dtype, wrapped or sharded). ``Run`` assembles its parts so, and
    shard-plan's trace on fake tensors (``preparing``: the context the model is prepared in)."""
    precision = build_precision(cfg, backend, facts.dtypes)
    with preparing:
        model = prepare_run_model(cfg, build_model, backend, precision.param_dtype, facts.checkpoint_every,
                                  compile_blocks=compile_blocks)
    return precision, model


def optimizer_spec(cfg, components: Components, device: torch.device) -> OptimizerSpec:
    """What --optimizer builds on ``device`` (the memory check and shard-plan read its facts too)."""
    spec = components.optimizer(cfg.optimizer, device)
    if chosen(cfg.common).stores_in_compute:
        spec = cpu_adam.for_fp16_parameters(spec)
    return spec


def build_optimizer(cfg, components: Components, params, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer of ``--optimizer``; with ``--zero-sharding os`` on several ranks, the
    same class and arguments behind a :class:`~shardtrain.trainer.parallel.zero.ShardedStateOptimizer`."""
    spec = optimizer_spec(cfg, components, device)
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if shards_optimizer_state(cfg.distributed.zero_sharding, world_size):
        from shardtrain.trainer.parallel.zero import ShardedStateOptimizer  # with DTensor, 2.4 s to import: only here
        optimizer = ShardedStateOptimizer(params, spec, first(cfg.optimization.lr))
        logger.info(optimizer.describe())
    else:
        optimizer = spec.build(params, first(cfg.optimization.lr))
        if cfg.distributed.zero_sharding != "none":
            logger.info("--zero-sharding os: one process, nothing to shard; the optimizer keeps all its state")
    group = optimizer.param_groups[0]
    kernel = getattr(spec.cls, "kernel", None) or (
        "fused" if group.get("fused") else "foreach" if group.get("foreach") else "for-loop")
    logger.info(f"optimizer: {spec.cls.__name__} ({kernel}) stepping on {device.type}")
    return optimizer


def build_lr_scheduler(cfg, components: Components, optimizer):
    scheduler = components.lr_scheduler
    direction = {"maximize": cfg.checkpoint.maximize_best_checkpoint_metric} if scheduler.follows_validation else {}
    lrs = tuple(numbers(cfg.optimization.lr))
    return scheduler(cfg.lr_scheduler, optimizer, lrs, cfg.optimization.max_update, **direction)

