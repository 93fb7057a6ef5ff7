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
                  "histories": run.spikes.state_dict()["histories"] if run.spikes else [],
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


class _Recording:
    """The run's criterion, recording each batch's summed loss and sample size."""

    def __init__(self, criterion, records):
        self.criterion, self.records = criterion, records

    def __getattr__(self, name):
        return getattr(self.criterion, name)

    def __call__(self, model, sample, *args, **kwargs):
        loss, sample_size, log = self.criterion(model, sample, *args, **kwargs)
        self.records[-1].append((float(loss), float(sample_size)))
        return loss, sample_size, log


def _first_rows(sample, rows: int):
    net = sample["net_input"]
    return {**sample, "id": sample["id"][:rows], "nsentences": rows, "target": sample["target"][:rows],
            "ntokens": int(net["src_lengths"][:rows].sum()),
            "net_input": {**net, "src_tokens": net["src_tokens"][:rows], "src_lengths": net["src_lengths"][:rows]}}


def uneven(cfg, ctx, record_dir):
    """Train with rank 1's first batch of every update cut to one sentence, so batches and ranks differ in
    size; each rank writes [per update: [(summed loss, sample size) per batch]] to record_dir/RANK.json.
    Returns the loss rule's history (every update's judged loss, the window being larger)."""
    import json
    import os

    run = Run(cfg, ctx)
    step, records = run.trainer.train_step, []
    run.trainer.criterion = _Recording(run.trainer.criterion, records)

    def trimming_step(samples):
        records.append([])
        if ctx.rank == 1:
            samples = [_first_rows(samples[0], 1), *samples[1:]]
        return step(samples)

    run.trainer.train_step = trimming_step
    try:
        train(run)
        history = list(run.spikes.rules[0].history)
    finally:
        run.close()
    with open(os.path.join(record_dir, f"{ctx.rank}.json"), "w") as f:
        json.dump(records, f)
    return history
