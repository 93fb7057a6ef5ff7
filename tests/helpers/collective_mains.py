"""Entry point run on every rank by the collective-count test (importable by spawned children).

One spawn trains several configurations one after the other in the same process
group (each spawn costs seconds) and records, for each update, the collectives
issued during each micro-batch's backward and during ``Backend.reduce_grads``.

Counting uses torch's public ``CommDebugMode``, a dispatch mode that sees every
``c10d`` / functional-collective op dispatched on this thread. On the CPU the
autograd engine runs backward on the calling thread, so it also sees what DDP's
C++ reducer issues from its autograd hook (``c10d.allreduce_``, one per bucket)
and FSDP2's hooks (``c10d._reduce_scatter_base_``, ``c10d._allgather_base_``):
the expected counts in test_collective_counts.py are non-zero for each backend.
"""
import copy
import re
from collections import Counter

from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor.debug import CommDebugMode

from shardtrain.trainer.loop import Run, train
from st_testutils import record_losses

# op name (e.g. "c10d.allreduce_", "_c10d_functional.reduce_scatter_tensor") -> kind of collective
KINDS = {"allreduce": "all_reduce", "all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter",
         "allgather": "all_gather", "all_gather": "all_gather", "broadcast": "broadcast"}


def count_variants(cfg, ctx, variants):
    """``variants``: {name: {section: {key: value}}} overrides of ``cfg``. Rank 0 returns, per
    variant, {"collectives": per update, per phase ("backward 0", ..., "reduce_grads"):
    {kind: count}, "losses": per update, "fsdp_units": FSDP units in the model, "weights": the
    full final weights}."""
    results = {}
    for name, overrides in variants.items():
        variant = copy.deepcopy(cfg)
        for section, values in overrides.items():
            for key, value in values.items():
                variant[section][key] = value
        results[name] = _count(variant, ctx)
    return results if ctx.is_master else None


def _count(cfg, ctx):
    run = Run(cfg, ctx)
    trainer, updates = run.trainer, []
    losses = record_losses(trainer)
    step, backward, reduce_grads = trainer.train_step, trainer.precision.backward, trainer.backend.reduce_grads

    def counting_step(samples):
        updates.append({})
        return step(samples)

    def counted(phase, fn):
        def wrapper(*args, **kwargs):
            with CommDebugMode() as mode:
                out = fn(*args, **kwargs)
            phases = updates[-1]  # micro-batch i's backward is "backward i"
            name = f"backward {sum(p.startswith('backward') for p in phases)}" if phase == "backward" else phase
            phases[name] = dict(_by_kind(mode.get_comm_counts()))
            return out
        return wrapper

    trainer.train_step = counting_step
    trainer.precision.backward = counted("backward", backward)
    trainer.backend.reduce_grads = counted("reduce_grads", reduce_grads)
    try:
        train(run)
        weights = run.backend.model_state_dict(trainer.model)  # a collective under FSDP
    finally:
        run.close()
    units = sum(isinstance(m, FSDPModule) for m in trainer.model.modules())
    return {"collectives": updates, "losses": losses, "fsdp_units": units,
            "weights": {k: v.float().numpy() for k, v in weights.items()}}


def _by_kind(counts) -> Counter:
    kinds = Counter()
    for op, n in counts.items():
        name = str(op)
        kind = next((k for pattern, k in KINDS.items() if re.search(pattern, name)), name)
        kinds[kind] += n
    return kinds
