"""One process, no communication: the backend used when the world size is 1."""
from shardtrain.trainer.parallel.base import BACKEND_REGISTRY, Backend


@BACKEND_REGISTRY.register("single_process")
class SingleProcessBackend(Backend):
    # Registered (so build_backend and plugins find it by name like any other) but not offered:
    # it is what one rank runs instead of a data-parallel backend, not a choice.
    user_selectable = False
