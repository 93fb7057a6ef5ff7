"""One process, no communication: the backend used when the world size is 1."""
from shardtrain.trainer.parallel.backend import BACKEND_REGISTRY, Backend


@BACKEND_REGISTRY.register("single_process")
class SingleProcessBackend(Backend):
    pass
