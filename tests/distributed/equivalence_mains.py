"""Entry points run on every rank by the equivalence tests (importable by spawned children)."""
from shardtrain.trainer.loop import Run, train
from shardtrain.trainer.memory import state_bytes
from st_testutils import record_losses


def train_and_record(cfg, ctx):
    """Train through the real loop; rank 0 returns (per-update losses, full final weights,
    the bytes of training state rank 0 holds)."""
    run = Run(cfg, ctx)
    losses = record_losses(run.trainer)
    try:
        train(run)
        held = state_bytes(run.trainer.params, run.trainer.optimizer)
        weights = run.backend.model_state_dict(run.trainer.model)  # a collective under FSDP
    finally:
        run.close()
    return (losses, {k: v.float().cpu().numpy() for k, v in weights.items()}, held) if ctx.is_master else None


def initial_weights(cfg, ctx):
    """The full weights a run starts from (before any update), on rank 0, as numpy."""
    run = Run(cfg, ctx)
    try:
        weights = run.backend.model_state_dict(run.trainer.model)  # a collective under FSDP
    finally:
        run.close()
    return {k: v.float().cpu().numpy() for k, v in weights.items()} if ctx.is_master else None
