"""Tasks and criterions. Built-ins are imported explicitly to register them."""
from shardtrain.tasks.base import Task  # noqa: F401
from shardtrain.tasks.registry import (  # noqa: F401
    CRITERION_REGISTRY, TASK_REGISTRY, register_criterion, register_task,
)
from shardtrain.tasks import criterions, language_modeling  # noqa: F401,E402 - registers built-ins
