"""What shardtrain may ask of a model beyond what every model must have, and the default when it
does not say: the one place the trainer, the planner and the inference commands ask.

Every model (registered with ``register_model``) must have ``build_model(cls, cfg, task)`` and
``forward(src_tokens)`` returning logits ``[batch, time, vocab]``. Everything below is optional;
docs/plugins.md describes each, and tests/models/test_capabilities.py holds the table to it.
"""
from typing import Optional

from torch import nn

# name -> what a model without it gets (docs/plugins.md lists the same)
DEFAULTS = {
    "max_positions": "unbounded: prompts, generation and --tokens-per-sample are not limited by the model",
    "flops_per_token": "6 x its parameter count per trained token (Kaplan et al.), with a notice in the log",
    "padding_idx": "the dictionary's padding symbol, which generation never produces",
    "new_kv_cache": "generation recomputes the whole prefix at every step",
    "init_weights": "the constructor's initialisation (refused by backends that build on the meta device)",
    "blocks": "FSDP wraps units of --min-params-to-wrap parameters; --checkpoint-activations and --compile refuse",
    "repeated_layers_field": "the memory check and shard-plan build the whole model on the meta device",
}


def max_positions(model: nn.Module) -> Optional[int]:
    """The longest sequence the model takes (an int attribute or property), None: unbounded (fairseq's
    decoders answer 1e6 when they have no limit)."""
    value = getattr(model, "max_positions", None)
    return int(value) if value is not None else None


def room_after(model: nn.Module, used: int, wanted: int) -> int:
    """How many of ``wanted`` more positions fit after ``used`` (``wanted`` for an unbounded model)."""
    limit = max_positions(model)
    return wanted if limit is None else min(wanted, limit - used)


def declares_flops(model: nn.Module) -> bool:
    return callable(getattr(model, "flops_per_token", None))


def flops_per_token(model: nn.Module, seq_len: int) -> float:
    """Training FLOPs (forward and backward) per token on sequences of ``seq_len``: the model's own
    ``flops_per_token(seq_len)``, else 6 x its parameters (which leaves attention out)."""
    if declares_flops(model):
        return float(model.flops_per_token(seq_len))
    return 6.0 * sum(p.numel() for p in model.parameters())


def padding_idx(model: nn.Module, dictionary_pad: Optional[int]) -> Optional[int]:
    """The token generation must never produce: the model's ``padding_idx``, else the dictionary's."""
    own = getattr(model, "padding_idx", None)
    return own if own is not None else dictionary_pad


def has_kv_cache(model: nn.Module) -> bool:
    """True when ``model.new_kv_cache()`` exists and ``forward(tokens, cache=...)`` takes it."""
    return callable(getattr(model, "new_kv_cache", None))


def has_init_weights(module: nn.Module) -> bool:
    return callable(getattr(module, "init_weights", None))


def blocks(model: nn.Module) -> Optional[nn.ModuleList]:
    """The model's repeated blocks (the unit of FSDP, activation checkpointing and --compile), None if not said."""
    found = getattr(model, "blocks", None)
    return found if isinstance(found, nn.ModuleList) else None


def repeated_layers_field(model_cls: type) -> Optional[str]:
    """The config field that counts the model's repeated layers (a class attribute), None if not said."""
    return getattr(model_cls, "repeated_layers_field", None)
