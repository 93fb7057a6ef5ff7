"""Activation checkpointing (``--checkpoint-activations``), applied from outside
to each element of ``model.blocks``.

A checkpointed block keeps only its input for backward and recomputes
everything else inside it when backward reaches it (non-reentrant
``torch.utils.checkpoint``, which restores the RNG state, so dropout masks
and gradients are exactly those of an uncheckpointed run).

Instead of torch's ``checkpoint_wrapper`` (a wrapper module: it adds
``_checkpoint_wrapped_module.`` to every parameter name, which state-dict
hooks strip but ``named_parameters()`` and the optimizer's names do not), the
block's ``forward`` is replaced on the instance. Parameter names, state-dict
keys and checkpoints stay exactly as without checkpointing.

Order, as in torchtitan: checkpointing first, then the backend's wrap
(``fully_shard`` per block, then the root), so each FSDP unit's hooks run
around a checkpointed block and recomputation in backward sees the gathered
parameters.

``--offload-activations`` (fairseq's flag, which turns checkpointing on)
additionally moves the inputs that checkpointed blocks keep for backward to
CPU memory (``torch.autograd.graph.save_on_cpu``) and back when needed.
"""
import contextlib
import functools
import logging
from typing import Callable, List, Optional

import torch
from torch import nn
from torch.autograd.graph import save_on_cpu
from torch.utils.checkpoint import checkpoint

from shardtrain.core.errors import ConfigError
from shardtrain.models import capabilities

logger = logging.getLogger(__name__)



def checkpoint_every(distributed) -> Optional[int]:
    """Every how many blocks activations are checkpointed (None: not at all). The one place that decides it:
    --checkpoint-activations, or --offload-activations, which implies it (fairseq's rule); then
    --checkpoint-activations-every."""
    on = distributed.checkpoint_activations or distributed.offload_activations
    return distributed.checkpoint_activations_every if on else None


def checkpointed_indices(num_blocks: int, every: int) -> List[int]:
    """The K-th, 2K-th, ... block (torchtitan's selective per-layer policy, 1-based count)."""
    return [i for i in range(num_blocks) if (i + 1) % every == 0]


def apply_activation_checkpointing(model: nn.Module, every: int, offload: bool,
                                   device: torch.device) -> List[int]:
    """Checkpoint every ``every``-th block of ``model.blocks`` in place; returns their indices.

    ``offload``: keep the checkpointed blocks' saved inputs in CPU memory
    (pinned on CUDA). ``device``: where the model computes. Call before the
    backend wraps the model (works on meta-device models: nothing is moved).
    """
    blocks = capabilities.blocks(model)
    if blocks is None:
        raise ConfigError(
            f"--checkpoint-activations checkpoints each of the model's repeated blocks, but "
            f"{type(model).__name__} has no `blocks` attribute (an nn.ModuleList of its transformer layers). "
            "Add one (see shardtrain/models/transformer_lm/model.py) or drop --checkpoint-activations and "
            "--offload-activations.")
    if every < 1:
        raise ConfigError(f"--checkpoint-activations-every must be at least 1 (got {every}).")
    offload_context = _offload_context(device) if offload else None
    indices = checkpointed_indices(len(blocks), every)
    for i in indices:
        block = blocks[i]
        assert "forward" not in vars(block), "a block's forward was already replaced (checkpointed twice?)"
        # The bound method (not a closure over it) so that deepcopy rebinds it to the copied block.
        block.forward = functools.partial(_checkpointed_forward, block.forward, offload_context)
    where = ", inputs kept in CPU memory" if offload else ""
    logger.info(f"activation checkpointing: {len(indices)} of {len(blocks)} blocks checkpointed "
                f"(every {every}){where}")
    return indices


def _offload_context(device: torch.device) -> Callable[[], save_on_cpu]:
    if device.type == "cpu":
        # Still applied (the hooks copy nothing on the CPU) so the path is the one CUDA runs.
        logger.warning("--offload-activations moves saved activations to CPU memory, but this run already "
                       "computes on the CPU: it saves no memory here (checkpointing still applies).")
    # Pinned host memory makes the copies asynchronous; it only exists next to an accelerator.
    return functools.partial(save_on_cpu, pin_memory=device.type == "cuda", device_type=device.type)


def _checkpointed_forward(forward: Callable, offload_context: Optional[Callable], *args, **kwargs):
    if not torch.is_grad_enabled():
        # Validation and generation (no_grad) keep nothing for backward: nothing to save.
        # This also keeps a KV cache from being appended to twice by a recomputation.
        return forward(*args, **kwargs)
    # save_on_cpu wraps the checkpoint call, so what it moves is what the checkpoint
    # itself saves (the block's inputs); the recomputed internals never reach it.
    with offload_context() if offload_context is not None else contextlib.nullcontext():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
