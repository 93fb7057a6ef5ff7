"""The error a run stops with when its loss or gradient turns NaN/inf.

Its own module because the loop, the spike guard and the trainer raise or catch it without needing the
precision components themselves."""
from typing import Optional

from shardtrain.core.errors import ShardtrainError


class TrainingDivergedError(ShardtrainError):
    """The loss or gradient became NaN/inf. The error of update ``update`` says whether a checkpoint is intact,
    which the checkpoint code knows and the precision does not: the loop re-raises it ``naming`` the newest
    checkpoint this run checked finite (CheckpointManager.last_checked_save)."""

    def __init__(self, message: str, update: Optional[int] = None, skip_nan: int = 0):
        super().__init__(message)
        self.update, self.skip_nan = update, skip_nan

    def naming(self, checked_save: Optional[str]) -> "TrainingDivergedError":
        if self.update is None:  # not an update's (--spike-max-rollbacks): it names no checkpoint
            return self
        return diverged_at(self.update, self.skip_nan, checked_save)


def diverged_at(update: int, skip_nan: int, checked_save: Optional[str] = None) -> TrainingDivergedError:
    """Update ``update``'s loss or gradient is NaN/inf, after ``skip_nan`` such updates skipped in a row;
    ``checked_save``: the newest checkpoint this run saved after checking it finite, or None."""
    skipped = f" after skipping {skip_nan} in a row (--skip-nan-updates)" if skip_nan else ""
    return TrainingDivergedError(
        f"The loss or gradient is NaN/inf at update {update}{skipped}; stopping before the weights are "
        f"corrupted ({_last_checkpoint(checked_save)}). Lower --lr, add warmup (--warmup-updates), "
        f"set --clip-norm, or check the data of this update"
        f"{'' if skip_nan else ' (or pass over such updates with --skip-nan-updates N)'}.", update, skip_nan)


def _last_checkpoint(checked_save: Optional[str]) -> str:
    """Only a checkpoint this run checked finite may be called intact."""
    if checked_save is not None:
        return f"the last checkpoint this run saved, {checked_save}, was checked finite"
    return ("this run saved no checkpoint yet; if it resumed from one, that checkpoint was not checked "
            "and may hold NaN/inf itself")
