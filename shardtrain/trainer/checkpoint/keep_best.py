"""--keep-best-checkpoints N: the N best checkpoints by --best-checkpoint-metric, as fairseq 0.12.2
names and prunes them (fairseq/checkpoint_utils.py save_checkpoint): ``checkpoint.best_{metric}_
{value:.3f}{digit}.pt``, where the digit (0 to N-1, seeded by epoch, update and value) keeps equal
values apart. A sharded checkpoint has the same name without ``.pt``, as a link to its directory."""
import os
import re
from typing import List, Optional

import numpy as np


def _ranked(save_dir: str, metric: str) -> List[tuple]:
    """(value, path) of the best-checkpoints in ``save_dir``, largest value first (fairseq's order)."""
    pattern = re.compile(r"checkpoint\.best_{}_(\d+\.?\d*)(\.pt)?".format(re.escape(metric)))
    found = []
    for name in os.listdir(save_dir) if os.path.isdir(save_dir) else []:
        m = pattern.fullmatch(name)
        if m:
            found.append((float(m.group(1)), os.path.join(save_dir, name)))
    return sorted(found, reverse=True)


def best_name(checkpoint, epoch: int, updates: int, value: Optional[float]) -> Optional[str]:
    """The name to save this validation's checkpoint under, or None when N better ones exist."""
    if value is None or checkpoint.keep_best_checkpoints <= 0:
        return None
    ranked = _ranked(checkpoint.save_dir, checkpoint.best_checkpoint_metric)
    if ranked:
        maximize = checkpoint.maximize_best_checkpoint_metric
        worst = ranked[-1][0] if maximize else ranked[0][0]
        if not (value > worst if maximize else value < worst):
            return None
    seed = int(hash((epoch, updates, value)) % 1e6)  # fairseq's data_utils.numpy_seed(epoch, updates, value)
    digit = np.random.RandomState(seed).randint(0, checkpoint.keep_best_checkpoints)
    return f"checkpoint.best_{checkpoint.best_checkpoint_metric}_{value:.3f}{digit}.pt"


def prune_best(checkpoint) -> None:
    """Remove best-checkpoints beyond the N best (rank 0, after a save)."""
    if checkpoint.keep_best_checkpoints <= 0:
        return
    ranked = [path for _, path in _ranked(checkpoint.save_dir, checkpoint.best_checkpoint_metric)]
    if not checkpoint.maximize_best_checkpoint_metric:
        ranked = ranked[::-1]
    for path in ranked[checkpoint.keep_best_checkpoints:]:
        os.remove(path)  # a file, or the link naming a sharded directory (its prune drops the directory)
