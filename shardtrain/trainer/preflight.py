"""Everything a run can check before it starts its ranks and builds its model.

The components check their own settings when they are built (a schedule its warmup against its length,
an architecture its heads against its width, a criterion its metric): so the launcher builds the cheap
ones once, up front, in the process that will spawn the ranks: the task (its dictionary, and that every
split the run names exists and holds lines), the criterion,
the model on the meta device (no memory; one of its repeated layers) and that its forward takes what the task's
batches hold (a document mask: ``capabilities.forward_inputs``, which the first step would refuse too, but only
after the ranks started and built everything), a Hugging Face folder to fine-tune from against the data-bin's
vocabulary and the model's shapes, the optimizer and the lr schedule over one dummy parameter.
A mistake is then reported in seconds, before any rank starts, in the same words as in a rank.
"""
import torch

from shardtrain.config.epoch_lists import first
from shardtrain.models.capabilities import forward_inputs
from shardtrain.models.hf_config import is_hf_folder, read_folder_config
from shardtrain.trainer import build
from shardtrain.trainer.checkpoint.hf_folder import check_folder
from shardtrain.trainer.memory.layers import one_layer_config
from shardtrain.trainer.metrics.tensorboard import TensorboardWriter
from shardtrain.trainer.resolved import Components, build_criterion, build_task


def check_before_launch(cfg) -> None:
    components = Components.of(cfg)
    task = build_task(cfg, components)
    check_split = getattr(task, "check_split", None)  # a plugin task need not have it
    if check_split is not None:
        d = cfg.dataset
        for split in [d.train_subset] + ([] if d.disable_validation else d.valid_subset.split(",")):
            check_split(split)
    criterion = build_criterion(cfg, components, task)
    check_batch_tokens = getattr(criterion, "check_batch_tokens", None)  # criterions.ProjectedLoss: --loss-chunks
    tokens = largest_batch_tokens(cfg, task)
    if check_batch_tokens is not None and tokens is not None:
        check_batch_tokens(tokens)
    if not cfg.dataset.disable_validation:
        build.check_best_checkpoint_metric(cfg.checkpoint.best_checkpoint_metric, task, criterion)
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # no memory, and the RNG as it was
        model = task.build_model(components.model, one_layer_config(cfg, components))
        forward_inputs(model, task.dummy_batch(1, 1, device="meta")["net_input"])  # refuses what it cannot take
        folder = cfg.checkpoint.finetune_from_model
        if is_hf_folder(folder):
            check_vocabulary = getattr(task, "check_model_vocabulary", None)  # a plugin task need not have it
            if check_vocabulary is not None:  # the data-bin's ids are the folder's tokens: named before shapes
                check_vocabulary(read_folder_config(folder).vocab_size, folder)
            check_folder(folder, task.build_model(components.model, cfg.model))  # every tensor, headers only
    spec = components.optimizer(cfg.optimizer, torch.device("cpu"))
    optimizer = spec.build([torch.nn.Parameter(torch.zeros(1))], first(cfg.optimization.lr))
    build.build_lr_scheduler(cfg, components, optimizer)
    if cfg.common.tensorboard_logdir:
        TensorboardWriter.check_logdir(cfg.common.tensorboard_logdir)


def largest_batch_tokens(cfg, task):
    """The rows of the run's largest training batch, padding included: --batch-size blocks of the task's longest
    sample, within --max-tokens; None where neither bounds it."""
    d, length = cfg.dataset, task.max_positions()
    bounds = [d.batch_size * length if d.batch_size and length else None, d.max_tokens]
    bounds = [b for b in bounds if b]
    return min(bounds) if bounds else None
