"""Entry points run on every rank by test_adaptive_ranks.py (importable by spawned children)."""
import torch
import torch.distributed as dist

from shardtrain.models.transformer_lm import TransformerLanguageModel
from shardtrain.trainer.loop import Run, train
from equivalence_mains import record_steps


def _lm(model):
    return next(m for m in model.modules() if isinstance(m, TransformerLanguageModel))


def _record_skips(lm) -> list:
    """Make the model's LayerDrop append each training forward's keep list to the returned list."""
    decisions, keep = [], lm.layerdrop.keep

    def recording_keep(num_blocks, training):
        kept = keep(num_blocks, training)
        if training:
            decisions.append(kept)
        return kept

    lm.layerdrop.keep = recording_keep
    return decisions


def train_and_report(cfg, ctx):
    """Train through the real loop. Rank 0 returns per-update losses, the full final weights
    (numpy), the fraction of each adaptive parameter this rank holds, and every rank's list
    of layerdrop decisions (gathered, so a test sees whether ranks skipped alike)."""
    run = Run(cfg, ctx)
    # Ranks' global generators differ in real runs (per-rank re-seeding on resume, dropout over
    # batches of different shapes); here they would agree, so make them differ: layerdrop must
    # not depend on them.
    torch.manual_seed(1000 + ctx.rank)
    lm = _lm(run.trainer.model)
    decisions, losses = _record_skips(lm), record_steps(run.trainer)["losses"]
    try:
        held = {name: _local_numel(p) / p.numel() for name, p in lm.named_parameters()
                if "adaptive" in name or name.startswith("embed_tokens")}
        train(run)
        weights = run.backend.model_state_dict(run.trainer.model)  # a collective under FSDP
        every_rank = [None] * ctx.world_size
        if ctx.world_size > 1:
            dist.all_gather_object(every_rank, decisions)
        else:
            every_rank = [decisions]
    finally:
        run.close()
    if not ctx.is_master:
        return None
    return {"losses": losses, "weights": {k: v.float().cpu().numpy() for k, v in weights.items()},
            "held": held, "decisions": every_rank}


def _local_numel(param: torch.Tensor) -> int:
    local = getattr(param, "to_local", None)
    return local().numel() if local is not None else param.numel()
