"""Rebuild a model from a checkpoint alone (for validation and generation)."""
import logging
from typing import Optional, Tuple

import torch

from shardtrain.config.build import from_dict
from shardtrain.trainer import build
from shardtrain.trainer.checkpoints import load_checkpoint, resolve_checkpoint_path
from shardtrain.trainer.sharded_checkpoints import is_sharded, load_extra, load_sharded_into
from shardtrain.trainer.resume import check_fingerprint
from shardtrain.errors import CheckpointError

logger = logging.getLogger(__name__)


def load_for_inference(path: str, data: Optional[str] = None, cpu: bool = False) -> Tuple:
    """-> (cfg, task, model in eval mode, device).

    The checkpoint's config is enough to rebuild the model; ``data`` points the
    task at another copy of the data-bin (its dictionary must match). Either
    form works: a single file, or a sharded directory (``checkpoint_last.pt``
    finds the directory ``checkpoint_last`` when there is no such file).
    """
    path = resolve_checkpoint_path(path)
    state = load_extra(path) if is_sharded(path) else load_checkpoint(path, model_only=True)
    values = dict(state["cfg"])
    if data is not None:
        values["task"] = {**values.get("task", {}), "data": data}
    values["common"] = {**values.get("common", {}), "cpu": cpu or values.get("common", {}).get("cpu", False)}
    cfg = from_dict(values)
    task = build.build_task(cfg)
    check_fingerprint(task, state, path)
    model = build.build_model(cfg, task)
    try:
        if is_sharded(path):
            load_sharded_into(path, model, None)  # DCP assembles the full tensors from the shards
        else:
            model.load_state_dict(state["model"])
    except RuntimeError as e:
        raise CheckpointError(f"The model in {path} does not fit the data-bin {cfg.task.data!r}: "
                              f"{str(e).splitlines()[1][:200] if len(str(e).splitlines()) > 1 else e}. "
                              "Use the data-bin the checkpoint was trained on.") from None
    device = build.select_device(cfg)
    model.to(device).eval()
    return cfg, task, model, device


@torch.no_grad()
def evaluate(criterion, model, batches, device, metrics) -> None:
    """Run the criterion over ``batches`` and accumulate its metrics."""
    for sample in batches:
        if not sample:
            continue
        sample = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in sample.items()}
        sample["net_input"] = {k: v.to(device) for k, v in sample["net_input"].items()}
        _, _, log = criterion(model, sample)
        criterion.reduce_metrics([{k: float(v) for k, v in log.items()}], metrics)
