"""Rank entry points for tests/trainer/checkpoint/test_finite_checkpoint.py (importable by spawned ranks)."""
import torch

from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.checkpoint.finite import check_finite
from shardtrain.trainer.launch.ranks import gather_to_rank0
from shardtrain.trainer.loop import Run


def refusals_when_one_rank_is_damaged(cfg, ctx):
    """Every rank checks twice: all finite, then with NaN in rank 1's own parameter shard only.
    Rank 0 returns each rank's [first outcome, second outcome] (None, or the refusal's text)."""
    run = Run(cfg, ctx)
    try:
        trainer, outcomes = run.trainer, []
        for damage in (False, True):
            if damage and ctx.rank == 1:
                with torch.no_grad():
                    param = trainer.params[-1]
                    local = param.to_local() if hasattr(param, "to_local") else param
                    local.view(-1)[0] = float("nan")
            try:
                check_finite(trainer.model, trainer.optimizer, run.backend, 7)
                outcomes.append(None)
            except CheckpointError as e:
                outcomes.append(str(e))
        return gather_to_rank0(outcomes)
    finally:
        run.close()
