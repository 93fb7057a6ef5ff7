"""Build a run's components from the typed config (the trainer only wires them)."""
import logging

import torch
import torch.distributed as dist

from shardtrain.config.components import resolve
from shardtrain.config.epoch_lists import first, numbers
from shardtrain.config.sections import chosen_precision
from shardtrain.core.errors import ConfigError
from shardtrain.optim import cpu_adam
from shardtrain.trainer.parallel import zero
from shardtrain.trainer.precision import LOW_PRECISION_STORAGE

logger = logging.getLogger(__name__)


def select_device(cfg) -> torch.device:
    if not cfg.common.cpu and torch.cuda.is_available():  # --cpu never asks the driver
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def build_task(cfg):
    info = resolve(cfg.components)["task"]
    return info.obj.setup_task(cfg.task)


def build_model(cfg, task):
    info = resolve(cfg.components)["model"]
    return task.build_model(info.obj, cfg.model)


def init_weights(model, seed: int) -> None:
    """The canonical initialisation: ``model.init_weights()`` from a freshly seeded
    RNG. Every backend ends with it (FSDP after materialising its shards), so a
    seed gives the same weights whatever the backend or world size. Models
    without ``init_weights`` keep their constructor's initialisation."""
    if hasattr(model, "init_weights"):
        torch.manual_seed(seed)
        with torch.no_grad():
            model.init_weights()


def build_criterion(cfg, task):
    info = resolve(cfg.components)["criterion"]
    return task.build_criterion(info.obj, cfg.criterion, sentence_avg=cfg.optimization.sentence_avg)


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


def build_optimizer(cfg, params, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer of ``--optimizer``; with ``--zero-sharding os`` on several ranks, the
    same class and arguments behind a :class:`~shardtrain.trainer.parallel.zero.ShardedStateOptimizer`."""
    info = resolve(cfg.components)["optimizer"]
    spec = info.obj(cfg.optimizer, device)
    if chosen_precision(cfg.common) in LOW_PRECISION_STORAGE:
        spec = cpu_adam.for_fp16_parameters(spec)
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if zero.shards_optimizer_state(cfg.distributed.zero_sharding, world_size):
        optimizer = zero.ShardedStateOptimizer(params, spec, first(cfg.optimization.lr))
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


def build_lr_scheduler(cfg, optimizer):
    info = resolve(cfg.components)["lr_scheduler"]
    direction = {"maximize": cfg.checkpoint.maximize_best_checkpoint_metric} if info.obj.follows_validation else {}
    lrs = tuple(numbers(cfg.optimization.lr))
    return info.obj(cfg.lr_scheduler, optimizer, lrs, cfg.optimization.max_update, **direction)


def log_model_size(model) -> None:
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger.info(f"num. model params: {total:,} (num. trained: {trained:,})")
