"""Model and architecture registries.

A *model* is an ``nn.Module`` class with a config dataclass and a
``build_model(cls, cfg, task)`` classmethod. An *architecture* is a named
preset of that config (fairseq's ``register_model_architecture``): a function
returning a dict of field values. Presets fill in defaults; any flag the user
gives explicitly overrides them.
"""
import dataclasses
from typing import Callable, Dict

from shardtrain.core.registry import Registry

MODEL_REGISTRY = Registry("model", flag="--arch")
ARCH_REGISTRY = Registry("architecture", flag="--arch")


@dataclasses.dataclass(frozen=True)
class Architecture:
    model: str
    preset: Callable[[], Dict]

    def values(self) -> Dict:
        return dict(self.preset())


def register_model(name: str, dataclass=None):
    """Register a model class; its name is also an architecture with no preset."""

    def decorator(cls):
        MODEL_REGISTRY.add(name, cls, dataclass)
        ARCH_REGISTRY.add(name, Architecture(name, dict))
        return cls

    return decorator


def register_model_architecture(model_name: str, arch_name: str):
    """``@register_model_architecture("transformer_lm", "transformer_lm_gpt")``
    on a function that returns the preset's ``{field: value}`` dict."""

    def decorator(fn):
        ARCH_REGISTRY.add(arch_name, Architecture(model_name, fn))
        return fn

    return decorator
