"""Data-parallel backends; built-ins are imported explicitly to register them."""
from shardtrain.trainer.backends.base import BACKEND_REGISTRY, Backend, unwrap  # noqa: F401
from shardtrain.trainer.backends import ddp, fsdp, legacy_ddp, single  # noqa: F401,E402 - registers built-ins


def build_backend(cfg, ctx) -> Backend:
    """The backend for ``--ddp-backend`` (single_process when one rank needs no wrapping)."""
    name = cfg.distributed.ddp_backend
    if ctx.world_size == 1 and name != "fully_sharded":
        name = "single_process"  # DDP on one rank only adds overhead
    return BACKEND_REGISTRY.get(name).obj(ctx, cfg)
