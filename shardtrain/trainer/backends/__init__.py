"""Data-parallel backends; built-ins are imported explicitly to register them."""
import torch

from shardtrain.trainer.backends.base import BACKEND_REGISTRY, Backend, unwrap  # noqa: F401
from shardtrain.trainer.backends import single  # noqa: F401,E402 - registers built-ins


def build_backend(name: str, device: torch.device) -> Backend:
    return BACKEND_REGISTRY.get(name).obj(device)
