"""``--compile``: torch.compile each element of ``model.blocks``, from outside.

Per block rather than the whole model (torchtitan's choice): the blocks share one
compiled graph (torch inlines module attributes as inputs, so a 96-layer model
compiles once, not 96 times), and the compiled region ends where the backend's
per-block hooks begin: FSDP2's all-gathers and reduce-scatters, DDP's buckets,
stay eager.

As activation checkpointing does, the block's ``forward`` is replaced on the
instance (no wrapper module): parameter names, state-dict keys and checkpoints
stay exactly as without compiling, so a compiled run resumes an eager one's
checkpoint and back. Order (prepare_model): after checkpointing, so the compiled
graph holds the recomputation; before the backend wraps the blocks.
"""
import logging

import torch
from torch import nn

from shardtrain.core.errors import ConfigError
from shardtrain.models import capabilities

logger = logging.getLogger(__name__)


def apply_compile(model: nn.Module) -> int:
    """Compile every block of ``model.blocks`` in place; returns how many."""
    blocks = capabilities.blocks(model)
    if blocks is None:
        raise ConfigError(
            f"--compile compiles each of the model's repeated blocks, but {type(model).__name__} has no `blocks` "
            "attribute (an nn.ModuleList of its layers). Add one (see shardtrain/models/transformer_lm/model.py) or drop "
            "--compile.")
    # Inductor draws dropout masks from its own generator unless told to use eager's: with this, a
    # compiled run draws the masks an eager run draws (same seed, same masks), so compiled and eager
    # runs, and a resumed run, agree. It costs a little speed, and only where dropout is on.
    torch._inductor.config.fallback_random = True
    for block in blocks:
        block.forward = torch.compile(block.forward)
    logger.info(f"torch.compile: {len(blocks)} blocks (the first updates compile them)")
    return len(blocks)
