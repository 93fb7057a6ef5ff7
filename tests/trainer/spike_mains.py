"""Rank mains for the --spike-rollback tests (importable by spawned ranks)."""
import torch

from shardtrain.trainer.loop import Run, train

POISON_RANK = {1: 0, 2: 1}  # the rank whose batch is poisoned, by world size: rank 1 where there are two


def _weights(run, ctx):
    state = run.backend.model_state_dict(run.trainer.model)  # a collective under FSDP
    return {k: v.float().cpu().clone() for k, v in state.items()} if ctx.is_master else None


def poisoned(cfg, ctx, poison_call: int):
    """Train with the ``poison_call``-th batch of one rank poisoned: every target set to one token, so
    the loss of that update spikes. Returns a dict: weights, per-update losses, rollbacks (updates),
    skipped (windows), updates, lr."""
    run = Run(cfg, ctx)
    step, calls, losses = run.trainer.train_step, [0], []

    def poisoning_step(samples):
        calls[0] += 1
        if calls[0] == poison_call and ctx.rank == POISON_RANK[ctx.world_size]:
            for s in samples:
                s["target"] = torch.full_like(s["target"], 3)  # <unk>, which the data never holds as a target
        out = step(samples)
        losses.append(out["logs"][0]["loss"] / max(out["sample_size"], 1.0))
        return out

    run.trainer.train_step = poisoning_step
    try:
        train(run)
        result = {"weights": _weights(run, ctx), "losses": losses,
                  "rollbacks": list(run.spikes.rollbacks) if run.spikes else [],
                  "skipped": list(run.spikes.skipped) if run.spikes else [],
                  "updates": run.trainer.num_updates, "lr": run.trainer.get_lr()}
    finally:
        run.close()
    return result if ctx.is_master else None


def skipping(cfg, ctx, skip_calls):
    """Train with the batches of the ``skip_calls``-th updates never seen (a run whose data lacks them)."""
    run = Run(cfg, ctx)
    step, calls = run.trainer.train_step, [0]

    def skipping_step(samples):
        calls[0] += 1
        if calls[0] in skip_calls:
            return {"stepped": False, "logs": [], "sample_size": 0.0}
        return step(samples)

    run.trainer.train_step = skipping_step
    try:
        train(run)
        weights = _weights(run, ctx)
    finally:
        run.close()
    return (weights, run.trainer.num_updates) if ctx.is_master else None
