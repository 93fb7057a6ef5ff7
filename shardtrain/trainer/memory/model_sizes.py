"""The sizes of the model a config describes, from builds on the meta device (no memory): its parameters, buffer
bytes and parameter tensors, and the activations autograd keeps from the forward of one sequence, counted through
saved-tensor hooks (the fused attention kernels' own, ``_FusedAttention``). Only the model runs, in eval mode and
with the RNG state restored after, so counting changes nothing a run does (a criterion may count its calls;
layerdrop and dropout would draw random numbers). Deep models are built with one and two layers and extrapolated
(``layers.py``)."""
import logging
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from shardtrain.models.capabilities import forward_inputs
from shardtrain.trainer.memory.layers import layer_split
from shardtrain.trainer.resolved import Components

logger = logging.getLogger(__name__)
SIZES = ("count", "buffers", "tensors", "activations")  # what _meta_sizes counts, in its order


def model_sizes(cfg, components: Components, task, activations: bool = False) -> Tuple[int, int, int, int]:
    """(parameter count, buffer bytes, parameter tensors, activation bytes) of the model ``cfg``
    describes, built on the meta device; the activations (fp32) are counted when ``activations``."""
    rest, per_layer, layers = layer_split(cfg, components, _measure(components, task, activations))
    return tuple(rest[key] + layers * per_layer[key] for key in SIZES)


def block_share(cfg, components: Components, task) -> float:
    """The share of the model's parameters in its repeated layers (the blocks FSDP shards as units of their own;
    the rest, embeddings and output projection, is the root's); 1.0 for a model that names no repeated layers."""
    rest, per_layer, layers = layer_split(cfg, components, _measure(components, task, False))
    total = rest["count"] + layers * per_layer["count"]
    return layers * per_layer["count"] / total if layers and total else 1.0


def _measure(components: Components, task, activations: bool):
    """A run config -> its model's SIZES by name, from a meta build."""
    def measure(cfg) -> Dict[str, int]:
        length = task.max_positions() if activations else None
        return dict(zip(SIZES, _meta_sizes(components.model, cfg.model, task, length)))
    return measure


def _meta_sizes(model_cls, model_cfg, task, length: Optional[int] = None) -> Tuple[int, int, int, int]:
    """``length``: count the activations of one sequence this long (None: not counted)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # the RNG as it was, for the run
        model = task.build_model(model_cls, model_cfg)
        activations = _saved_bytes(model, task, length) if length else 0
    return (sum(p.numel() for p in model.parameters()),
            sum(b.numel() * b.element_size() for b in model.buffers()), len(list(model.parameters())), activations)


class _FusedAttention(TorchFunctionMode):
    """On the meta device F.scaled_dot_product_attention runs its math path, which keeps the length x
    length probabilities and copies of q, k and v that the fused kernels a run uses never store: route it
    to the CPU flash kernel's op (its meta version saves q, k, v, the output and the log-sum-exp, as CPU
    and CUDA flash attention do)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            mask, dropout, causal = (list(args[3:6]) + [None, 0.0, False][len(args[3:6]):])
            mask, dropout = kwargs.get("attn_mask", mask), kwargs.get("dropout_p", dropout)
            causal = kwargs.get("is_causal", causal)
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, dropout, causal, attn_mask=mask, scale=kwargs.get("scale"))[0]
        return func(*args, **kwargs)


def _saved_bytes(model, task, length: int) -> int:
    """Bytes autograd keeps from the forward of one ``length``-token sequence of the task's dummy batch on the
    meta model (attention
    as the fused kernels keep it: _FusedAttention): each saved tensor's storage once, parameters left out.
    A model that cannot run on meta or takes other inputs (a plugin's) counts 0."""
    params = {id(p) for p in model.parameters()}
    seen: Dict[int, torch.Tensor] = {}  # by id of the storage's owner, kept alive so ids are not reused

    def pack(t: torch.Tensor):
        owner = t if t._base is None else t._base
        if id(owner) not in params:
            seen.setdefault(id(owner), owner)
        return t

    model.eval()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _FusedAttention():
            model(**forward_inputs(model, task.dummy_batch(1, length, device="meta")["net_input"]))
    except Exception as e:  # noqa: BLE001 - any failure only means the activations go uncounted
        logger.info(f"activations not estimated: the model's forward could not run on the meta device ({e})")
        return 0
    return sum(t.numel() * t.element_size() for t in seen.values())
