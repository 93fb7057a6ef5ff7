"""Hugging Face's weight names for the ``llama`` family (``LlamaForCausalLM``, ``Qwen3ForCausalLM``) and ours.
Inside a block the names are the same (layer.py uses HF's); around the blocks they differ:

    model.embed_tokens.weight   <-> embed_tokens.weight
    model.layers.N.<rest>       <-> blocks.N.<rest>
    model.norm.weight           <-> norm.weight
    lm_head.weight              <-> output_projection.weight   (absent when the embeddings are tied)

Shapes and layouts need no change: rotary positions are in HF's rotate-half layout (rope.py)."""
import re
from typing import Optional

_AROUND = {"model.embed_tokens.weight": "embed_tokens.weight", "model.norm.weight": "norm.weight",
           "lm_head.weight": "output_projection.weight"}
_BACK = {ours: hf for hf, ours in _AROUND.items()}


def to_ours(hf_name: str) -> Optional[str]:
    """Our parameter name for HF's ``hf_name``; None for a name that is not one of the family's weights."""
    if hf_name in _AROUND:
        return _AROUND[hf_name]
    block = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", hf_name)
    return f"blocks.{block.group(1)}.{block.group(2)}" if block else None


def to_hf(name: str) -> str:
    """HF's name for our parameter ``name``."""
    if name in _BACK:
        return _BACK[name]
    block = re.fullmatch(r"blocks\.(\d+)\.(.+)", name)
    if block is None:
        raise KeyError(f"{name} is not a llama weight")
    return f"model.layers.{block.group(1)}.{block.group(2)}"
