"""Entry points run on every rank by the equivalence tests (importable by spawned children)."""
from shardtrain.trainer.loop import Run, train
from shardtrain.trainer.metrics.state_memory import state_bytes
from st_testutils import record_losses  # noqa: F401 - rng_mains imports it from here


def record_steps(trainer) -> dict:
    """Make ``trainer.train_step`` append, per update, its loss, the gradient norm it
    reports (the unclipped norm of the mean loss's gradient: what shows a gradient of
    the wrong scale when clipping is off) and whether it clipped, to the lists returned."""
    steps = {"losses": [], "gnorms": [], "clipped": []}
    step = trainer.train_step

    def recording_step(samples):
        out = step(samples)
        steps["losses"].append(out["logs"][0]["loss"] / out["sample_size"])  # unrounded, summed over ranks
        steps["gnorms"].append(out["gnorm"])
        steps["clipped"].append(bool(out["clip"]))
        return out

    trainer.train_step = recording_step
    return steps


def train_and_record_steps(cfg, ctx):
    """Train through the real loop; rank 0 returns record_steps' lists plus "weights"
    (the full final weights, as numpy) and "held" (the bytes of training state rank 0 holds)."""
    run = Run(cfg, ctx)
    steps = record_steps(run.trainer)
    try:
        train(run)
        held = state_bytes(run.trainer.params, run.trainer.optimizer)
        weights = run.backend.model_state_dict(run.trainer.model)  # a collective under FSDP
    finally:
        run.close()
    if not ctx.is_master:
        return None
    return {**steps, "weights": {k: v.float().cpu().numpy() for k, v in weights.items()}, "held": held}


def train_and_record(cfg, ctx):
    """Train through the real loop; rank 0 returns (per-update losses, full final weights,
    the bytes of training state rank 0 holds)."""
    result = train_and_record_steps(cfg, ctx)
    return (result["losses"], result["weights"], result["held"]) if ctx.is_master else None


def initial_weights(cfg, ctx):
    """The full weights a run starts from (before any update), on rank 0, as numpy."""
    run = Run(cfg, ctx)
    try:
        weights = run.backend.model_state_dict(run.trainer.model)  # a collective under FSDP
    finally:
        run.close()
    return {k: v.float().cpu().numpy() for k, v in weights.items()} if ctx.is_master else None
