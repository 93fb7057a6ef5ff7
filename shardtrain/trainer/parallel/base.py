"""The data-parallel backend interface.

The trainer holds one backend and never branches on which it is. A backend
wraps the model, says how gradients are reduced, skips communication on
accumulation steps, computes the global gradient norm, reduces scalars and
produces state dicts. Backends are registered by name (``--ddp-backend``
picks one); each lives in its own file.
"""
import contextlib
from typing import Any, Dict, Iterable, List, NamedTuple, Tuple

import torch
import torch.distributed as dist
from torch import nn

from shardtrain.core.registry import Registry
from shardtrain.trainer.parallel.host_norms import host_total_norm

BACKEND_REGISTRY = Registry("ddp_backend", flag="--ddp-backend")


class GradientCopies(NamedTuple):
    """Full copies of the gradients a backend keeps beside autograd's ``.grad`` (a memory tracker of the
    step does not see them): held through backward (DDP's buckets), or made after it (a flat buffer)."""
    during_backward: int = 0
    after_backward: int = 0


class Backend:
    # Capabilities: what the rest of shardtrain asks of a backend instead of its name.
    #: True when the wrapped model averages gradients over ranks (DDP, FSDP),
    #: so the loss is multiplied by world_size to turn that mean into a sum.
    grads_are_averaged: bool = False
    #: True when the backend builds the model on the meta device and
    #: materialises it itself (no rank ever holds the full model).
    init_on_meta: bool = False
    #: True when the backend casts parameters to --bf16/--fp16 itself (FSDP's
    #: MixedPrecisionPolicy, given to its constructor as ``mp_policy``), so the
    #: precision component must not autocast.
    casts_params: bool = False
    #: True when checkpoints are saved sharded (one DCP directory, every rank
    #: writing its own shards) rather than as one file written by rank 0.
    sharded_checkpoints: bool = False
    #: True when parameters, gradients and optimizer state are sharded across ranks.
    shards_parameters: bool = False
    #: True when --cpu-offload can keep the parameter shards in CPU memory.
    supports_cpu_offload: bool = False
    #: True when the backend is used as asked on one rank (single_process replaces the others there).
    wraps_a_single_rank: bool = False
    #: True when it needs a process group even on one rank (FSDP2 builds a device mesh on one):
    #: the run has launch start a 1-rank group before building it; a backend never starts one.
    needs_process_group: bool = False
    #: False for internal backends, which --ddp-backend does not offer.
    user_selectable: bool = True

    # Facts the planner (shardtrain.plan) and the memory check (trainer/run_facts.py) ask of a
    # backend class before any is built, from the run's ``distributed`` config section.
    @classmethod
    def parameter_shards(cls, distributed, world_size: int, ranks_per_node: int) -> int:
        """Ranks each parameter (its gradient and optimizer state) is split over: 1, whole on every rank."""
        return 1

    @classmethod
    def offloads_state(cls, distributed) -> bool:
        """True when the parameter shards, gradients and optimizer state live in host memory."""
        return False

    @classmethod
    def plan_variants(cls, name: str, world_size: int, ranks_per_node: int) -> List[Tuple[str, Dict[str, Any]]]:
        """The configurations of this backend (registered as ``name``) shard-plan weighs on ``world_size`` ranks of
        ``ranks_per_node`` a node: (label, ``distributed`` section overrides); none for one it does not weigh."""
        return []

    @classmethod
    def gradient_copies(cls, distributed) -> GradientCopies:
        return GradientCopies()

    @classmethod
    def bytes_communicated(cls, distributed, world_size: int, count: int, dtypes, micro_batches: int,
                           shards: int) -> int:
        """Bytes one rank sends (and receives) per update for ``count`` parameters, ring algorithms; ``dtypes``:
        the run's (precision.Dtypes); ``shards``: ``parameter_shards``. By default one all-reduce of every
        gradient, in the dtype the model is stored in, per update."""
        grad_bytes = (dtypes.storage or torch.float32).itemsize
        return int(2 * (world_size - 1) / world_size * count * grad_bytes)

    def __init__(self, ctx, distributed):
        """``ctx``: this rank's DistributedContext; ``distributed``: the run config's
        ``distributed`` section (the flags of --ddp-backend and its options)."""
        self.ctx = ctx
        self.distributed = distributed

    rank = property(lambda self: self.ctx.rank)
    world_size = property(lambda self: self.ctx.world_size)
    device = property(lambda self: self.ctx.device)
    is_master = property(lambda self: self.ctx.rank == 0)

    @property
    def optimizer_device(self) -> torch.device:
        """Where the optimizer state and step live (the CPU where the backend offloads it)."""
        return torch.device("cpu") if self.offloads_state(self.distributed) else self.device

    def wrap(self, model: nn.Module) -> nn.Module:
        if any(p.is_meta for p in model.parameters()):  # nothing to move (shard-plan's trace: fake tensors later)
            return model
        return model.to(self.device)

    def materialise(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """For ``init_on_meta`` backends: allocate this rank's part of the wrapped meta-device
        model on entry; the caller initialises it inside (see ``prepare.prepare_model``)."""
        raise NotImplementedError(f"{type(self).__name__} sets init_on_meta but does not materialise")

    def no_sync(self, module: nn.Module):
        """Context for accumulation steps: no gradient communication."""
        return contextlib.nullcontext()

    def reduce_grads(self, params: List[nn.Parameter]) -> None:
        """Called after the last backward of an update; backends that reduce
        during backward (DDP, FSDP) have nothing left to do."""

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(values)
        return values

    def grad_norm(self, params: Iterable[nn.Parameter]) -> torch.Tensor:
        """Norm of the full (unsharded) gradient, in fp32."""
        grads = [p.grad for p in params if p.grad is not None]
        on_host = host_total_norm(grads)  # the same bits, the host's cores sharing the tensors
        if on_host is not None:
            return on_host
        if all(g.dtype == torch.float32 for g in grads):
            return torch.nn.utils.get_total_norm(grads, foreach=True)
        # fp16 gradients (--memory-efficient-fp16) hold loss_scale x the summed loss's
        # gradient: their norm may pass fp16's maximum while every element is finite.
        norms = [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]
        return torch.linalg.vector_norm(torch.stack(norms))

    @torch.no_grad()
    def multiply_grads(self, params: Iterable[nn.Parameter], multiplier: float) -> None:
        """Scale every gradient in place (unscaling, 1/sample size and clipping in one pass)."""
        if multiplier != 1.0:
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(multiplier)

    def model_state_dict(self, module: nn.Module) -> Dict:
        return unwrap(module).state_dict()

    def load_model_state_dict(self, module: nn.Module, state_dict: Dict) -> None:
        unwrap(module).load_state_dict(state_dict)

    def optimizer_state_dict(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> Dict:
        # Keyed by parameter name (not position), as every backend and DCP key it,
        # so one checkpoint's optimizer state loads under any backend. DCP is imported
        # here, not at the top: it costs ~2 s of start-up that a refusal need not pay.
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
        return get_optimizer_state_dict(module, optimizer)

    def load_optimizer_state_dict(self, module: nn.Module, optimizer, state_dict: Dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
        set_optimizer_state_dict(module, optimizer, state_dict)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        pass


def unwrap(module: nn.Module) -> nn.Module:
    return getattr(module, "module", module)
