"""Data-parallel backends; built-ins are imported explicitly to register them.

The import order is the order --ddp-backend lists them in.
"""
from typing import List, Tuple

from shardtrain.trainer.parallel.base import BACKEND_REGISTRY, Backend, unwrap  # noqa: F401
from shardtrain.trainer.parallel import ddp  # noqa: F401
from shardtrain.trainer.parallel import legacy_ddp  # noqa: F401
from shardtrain.trainer.parallel import fully_sharded as fsdp  # noqa: F401
from shardtrain.trainer.parallel import single_process as single


def user_choices() -> List[str]:
    """What --ddp-backend offers: every registered backend users may pick, in registration order."""
    return [e.name for e in BACKEND_REGISTRY.entries() if e.obj.user_selectable]


def distinct_backends() -> List[Tuple[str, type]]:
    """Each backend --ddp-backend offers once, under its first name (fairseq's aliases left out)."""
    seen, out = set(), []
    for name in user_choices():
        cls = backend_class(name)
        if cls not in seen:
            seen.add(cls)
            out.append((name, cls))
    return out


def backend_class(name: str) -> type:
    return BACKEND_REGISTRY.get(name).obj


def names_with(capability: str) -> str:
    """The --ddp-backend choices that have ``capability`` (a Backend class attribute), for messages."""
    return " or ".join(name for name in user_choices() if getattr(backend_class(name), capability))


def chosen_backend_class(cfg, ctx) -> type:
    """The backend class ``--ddp-backend`` gives on ``ctx``'s ranks (single_process when one rank
    needs no wrapping): what the run asks, before building it, whether it needs a process group."""
    cls = backend_class(cfg.distributed.ddp_backend)
    if ctx.world_size == 1 and not cls.wraps_a_single_rank:
        cls = single.SingleProcessBackend  # DDP on one rank only adds overhead
    return cls


def build_backend(cfg, ctx, dtypes, cls: type = None) -> Backend:
    """The backend for ``--ddp-backend`` on ``ctx``'s ranks, inside the process group the launch made
    (one rank too, when the class ``needs_process_group``); ``dtypes``: the run's precision
    (``precision.run_dtypes``), whose ``policy`` a backend that casts itself receives; ``cls``: the class already
    chosen (the run's facts), else chosen here."""
    cls = cls or chosen_backend_class(cfg, ctx)
    if cls.casts_params:  # it computes in the precision's dtypes itself: hand them over
        return cls(ctx, cfg.distributed, mp_policy=dtypes.policy)
    return cls(ctx, cfg.distributed)
