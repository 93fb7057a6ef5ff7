"""Models, their architecture presets and the registries they live in."""
from shardtrain.models.registry import (
    ARCH_REGISTRY,
    MODEL_REGISTRY,
    Architecture,
    register_model,
    register_model_architecture,
)
from shardtrain.models import llama, transformer_lm  # noqa: F401  registers the built-in families

__all__ = [
    "ARCH_REGISTRY",
    "MODEL_REGISTRY",
    "Architecture",
    "register_model",
    "register_model_architecture",
]
