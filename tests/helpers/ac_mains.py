"""Entry point run on every rank by the activation-checkpointing test (importable by spawned children).

One spawn trains several configurations one after the other in the same
process group (each spawn costs seconds); ``Run`` reseeds, so each starts alike.
"""
import copy

from torch.distributed.fsdp import FSDPModule

from shardtrain.trainer.parallel.choose import unwrap
from shardtrain.trainer.loop import Run, train

# name -> cfg.distributed overrides
VARIANTS = {
    "fully_sharded": {"ddp_backend": "fully_sharded"},
    "fully_sharded+ac": {"ddp_backend": "fully_sharded", "checkpoint_activations": True},
    "fully_sharded+offload/2": {"ddp_backend": "fully_sharded", "offload_activations": True,
                                "checkpoint_activations_every": 2},
    "pytorch_ddp": {"ddp_backend": "pytorch_ddp"},
    "pytorch_ddp+ac": {"ddp_backend": "pytorch_ddp", "checkpoint_activations": True},
    "legacy_ddp": {"ddp_backend": "legacy_ddp"},
    "legacy_ddp+ac": {"ddp_backend": "legacy_ddp", "checkpoint_activations": True},
}


def train_variants(cfg, ctx):
    """Rank 0 returns {variant: (per-update losses, full final weights, per block: (is its own
    FSDP unit, is checkpointed))}."""
    results = {}
    for name, overrides in VARIANTS.items():
        variant = copy.deepcopy(cfg)
        for key, value in overrides.items():
            variant.distributed[key] = value
        results[name] = _train(variant)(ctx)
    return results if ctx.is_master else None


def _train(cfg):
    def run_on(ctx):
        run = Run(cfg, ctx)
        losses = []
        step = run.trainer.train_step

        def recording_step(samples):
            out = step(samples)
            losses.append(out["logs"][0]["loss"] / out["sample_size"])
            return out

        run.trainer.train_step = recording_step
        try:
            train(run)
            blocks = unwrap(run.trainer.model).blocks
            layout = [(isinstance(b, FSDPModule), "forward" in vars(b)) for b in blocks]
            weights = run.backend.model_state_dict(run.trainer.model)  # a collective under FSDP
        finally:
            run.close()
        return losses, {k: v.float().numpy() for k, v in weights.items()}, layout
    return run_on
