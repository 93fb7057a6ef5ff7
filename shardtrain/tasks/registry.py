"""Task and criterion registries."""
from shardtrain.core.registry import Registry

TASK_REGISTRY = Registry("task")
CRITERION_REGISTRY = Registry("criterion")


def register_task(name: str, dataclass=None):
    return TASK_REGISTRY.register(name, dataclass)


def register_criterion(name: str, dataclass=None):
    return CRITERION_REGISTRY.register(name, dataclass)
