"""One function prepares a model for training, in one fixed order (torchtitan's ``parallelize``).

The order matters, and each step says why it comes where it does. The
backend only shards or wraps; everything else about the model's way to the
training step is here, so a reader finds it in one place.
"""
import contextlib
import logging
from typing import Callable, Optional

import torch
from torch import nn

from shardtrain.core.errors import ConfigError
from shardtrain.models import capabilities
from shardtrain.trainer.parallel.activation_checkpointing import apply_activation_checkpointing
from shardtrain.trainer.parallel.base import BACKEND_REGISTRY, Backend
from shardtrain.trainer.parallel.compile import apply_compile

logger = logging.getLogger(__name__)


def prepare_run_model(cfg, build: Callable[[], nn.Module], backend: Backend, param_dtype: Optional[torch.dtype],
                      checkpoint_activations_every: Optional[int], compile_blocks: bool) -> nn.Module:
    """``prepare_model`` with the run's own settings: its seed and activation offloading from ``cfg``, and
    checkpointing every ``checkpoint_activations_every``-th block (the run's facts: ``RunFacts.checkpoint_every``).
    shard-train's Run prepares its model so, and shard-plan's trace (on fake tensors, not compiled)."""
    return prepare_model(build, backend, seed=cfg.common.seed, param_dtype=param_dtype,
                         checkpoint_activations_every=checkpoint_activations_every,
                         offload_activations=cfg.distributed.offload_activations, compile_blocks=compile_blocks)


def prepare_model(build: Callable[[], nn.Module], backend: Backend, *, seed: int,
                  param_dtype: Optional[torch.dtype] = None, checkpoint_activations_every: Optional[int] = None,
                  offload_activations: bool = False, compile_blocks: bool = False) -> nn.Module:
    """Build the model with ``build()`` and return it ready for the Trainer: initialised from
    ``seed``, activation-checkpointed every ``checkpoint_activations_every``-th block (None: off;
    ``offload_activations`` keeps the saved inputs in CPU memory), stored in ``param_dtype``
    (None: as built, fp32), its blocks torch.compiled when ``compile_blocks``, and wrapped or
    sharded by ``backend``."""
    # 1. Build. A backend that shards builds on the meta device, so no rank ever holds the
    #    whole model; the others initialise now, from a freshly seeded RNG.
    with torch.device("meta") if backend.init_on_meta else contextlib.nullcontext():
        model = build()
    if backend.init_on_meta and not capabilities.has_init_weights(model):
        raise ConfigError(f"--ddp-backend {_names(backend)} builds the model on the meta device and needs "
                          f"{type(model).__name__}.init_weights() to initialise its shards; add that method "
                          "(see shardtrain.models.init) or use --ddp-backend pytorch_ddp.")
    if not backend.init_on_meta:
        init_weights(model, seed)
    log_model_size(model)
    # 2. Activation checkpointing, before the backend wraps each block: FSDP's hooks then run
    #    around a checkpointed block, so recomputation in backward sees gathered parameters.
    if checkpoint_activations_every is not None:
        apply_activation_checkpointing(model, checkpoint_activations_every, offload_activations, backend.device)
    # 3. torch.compile per block: after checkpointing (the compiled graph holds the recomputation),
    #    before sharding (FSDP's and DDP's hooks around each block stay outside the graph).
    if compile_blocks:
        apply_compile(model)
    # 4. The storage dtype the precision decided (--memory-efficient-fp16: fp16 parameters and
    #    gradients), before wrapping, so DDP's buckets and broadcasts are in that dtype.
    if param_dtype is not None:
        model = model.to(param_dtype)
    # 5. Shard or wrap (FSDP2 per block, then the root; DDP; nothing on one process).
    model = backend.wrap(model)
    # 6. Materialise, then initialise: each rank allocates only its own shards and fills them
    #    with exactly the values an unsharded model gets from this seed (shardtrain.models.init).
    if backend.init_on_meta:
        with backend.materialise(model):
            init_weights(model, seed)
    return model


def init_weights(model: nn.Module, seed: int) -> None:
    """The canonical initialisation: ``model.init_weights()`` from a freshly seeded
    RNG. Every backend ends with it (FSDP after materialising its shards), so a
    seed gives the same weights whatever the backend or world size. Models
    without ``init_weights`` keep their constructor's initialisation."""
    if capabilities.has_init_weights(model):
        torch.manual_seed(seed)
        with torch.no_grad():
            model.init_weights()


def log_model_size(model: nn.Module) -> None:
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger.info(f"num. model params: {total:,} (num. trained: {trained:,})")


def _names(backend: Backend) -> str:
    """The --ddp-backend name(s) ``backend`` is registered under, for messages."""
    return " / ".join(e.name for e in BACKEND_REGISTRY.entries() if e.obj is type(backend)) or type(backend).__name__
