"""What shardtrain may ask of a model beyond what every model must have, and the default when it
does not say: the one place the trainer, the planner and the inference commands ask.

Every model (registered with ``register_model``) must have ``build_model(cls, cfg, task)`` and a
``forward`` that takes its task's ``net_input`` as keywords (``model(**sample["net_input"])``, as in
fairseq) and returns logits ``[batch, time, vocab]``: ``src_tokens`` always, and whatever else the task
puts there (positions, a document mask). Everything below is optional; docs/plugins.md describes each,
and tests/models/test_capabilities.py holds the table to it.
"""
import functools
import inspect
from typing import Dict, FrozenSet, Iterator, Optional

import torch
from torch import nn

from shardtrain.core.errors import ConfigError

# What a task may give that a model is free not to take: fairseq's models take src_lengths, and most ignore
# it, so a forward(src_tokens) written for an older shardtrain still runs.
IGNORABLE_INPUTS = ("src_lengths",)
# The inputs shardtrain's own tasks add on request, and the option that adds each (the refusal names it).
ADDED_BY = {"document_ids": "--attn-mask-type block_causal"}

# name -> what a model without it gets (docs/plugins.md lists the same)
DEFAULTS = {
    "max_positions": "unbounded: prompts, generation and --tokens-per-sample are not limited by the model",
    "flops_per_token": "6 x its parameter count per trained token (Kaplan et al.), with a notice in the log",
    "padding_idx": "the dictionary's padding symbol, which generation never produces",
    "new_kv_cache": "generation recomputes the whole prefix at every step",
    "init_weights": "the constructor's initialisation (refused by backends that build on the meta device)",
    "blocks": "FSDP wraps units of --min-params-to-wrap parameters; --checkpoint-activations and --compile refuse",
    "repeated_layers_field": "the memory check and shard-plan build the whole model on the meta device",
    "output_weight": "the loss takes the whole batch's logits from forward (--loss-chunks above 1 is refused)",
}


def forward_inputs(model: nn.Module, net_input: Dict) -> Dict:
    """The keywords ``model(**...)`` gets from a task's ``net_input``: all of it, less the inputs the model's
    forward does not take and may go without; an input it does not take and may not go without (a document
    mask) is refused, since the model would silently compute something else."""
    taken = _taken_inputs(_inner(model))
    if taken is None:
        return dict(net_input)
    refused = [k for k in net_input if k not in taken and k not in IGNORABLE_INPUTS]
    if refused:
        model_cls = type(_inner(model)).__name__
        them = "them" if len(refused) > 1 else "it"
        options = sorted({ADDED_BY[k] for k in refused if k in ADDED_BY}) or [f"the task option that adds {them}"]
        raise ConfigError(
            f"The task gives the model {', '.join(refused)}, which {model_cls}.forward does not take "
            f"(it takes {', '.join(sorted(taken)) or 'nothing by name'}). Use a model that takes {them} "
            f"(docs/plugins.md: what a model's forward takes), or drop {' and '.join(options)}.")
    return {k: v for k, v in net_input.items() if k in taken}


def _inner(model: nn.Module) -> nn.Module:
    """The model a wrapper forwards to: DDP's ``module``, torch.compile's ``_orig_mod`` (FSDP2 keeps the
    model's own class and forward)."""
    *_, inner = _layers(model)
    return inner


def _layers(model: nn.Module) -> Iterator[nn.Module]:
    """``model``, then each module it wraps, down to the model itself (see ``_inner``)."""
    yield model
    while _taken_inputs(model) is None:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
        yield model


@functools.lru_cache(maxsize=None)
def _taken_by_class(model_cls: type) -> Optional[FrozenSet[str]]:
    params = list(inspect.signature(model_cls.forward).parameters.values())[1:]  # after self
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None  # takes anything
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _taken_inputs(model: nn.Module) -> Optional[FrozenSet[str]]:
    """The keywords ``model``'s forward takes, None when it takes any (``**kwargs``)."""
    return _taken_by_class(type(model))


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


def output_weight(model: nn.Module) -> Optional[torch.Tensor]:
    """The [vocab, width] matrix whose ``F.linear`` of ``model(..., features_only=True)`` are forward's logits,
    for a loss that projects the features chunk by chunk (tasks/chunked_loss.py); call it after that forward,
    which gathers a sharded weight. None when the model cannot be chunked: its forward takes no
    ``features_only``, it has no ``output_weight()`` or that says None (an adaptive softmax), or a wrapper finds
    unused parameters (DDP's ``find_unused_parameters`` would mark an untied weight that the loss uses after
    forward as unused, then fail when its gradient arrives)."""
    layers = list(_layers(model))
    if any(getattr(layer, "find_unused_parameters", False) is True for layer in layers):
        return None
    inner = layers[-1]
    taken, method = _taken_inputs(inner), getattr(inner, "output_weight", None)
    if taken is None or "features_only" not in taken or not callable(method):
        return None
    weight = method()
    return weight if isinstance(weight, torch.Tensor) else None
