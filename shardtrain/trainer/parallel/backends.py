"""Data-parallel backends; built-ins are imported explicitly to register them."""
from shardtrain.trainer.parallel.backend import BACKEND_REGISTRY, Backend, unwrap  # noqa: F401
from shardtrain.trainer.parallel import ddp
from shardtrain.trainer.parallel import fully_sharded as fsdp
from shardtrain.trainer.parallel import legacy_ddp
from shardtrain.trainer.parallel import single_process as single


def build_backend(cfg, ctx) -> Backend:
    """The backend for ``--ddp-backend`` (single_process when one rank needs no wrapping)."""
    name = cfg.distributed.ddp_backend
    if ctx.world_size == 1 and name != "fully_sharded":
        name = "single_process"  # DDP on one rank only adds overhead
    return BACKEND_REGISTRY.get(name).obj(ctx, cfg)
