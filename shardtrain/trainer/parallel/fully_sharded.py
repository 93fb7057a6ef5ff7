"""``--ddp-backend fully_sharded``: FSDP2 (``torch.distributed.fsdp.fully_shard``).

Parameters, gradients and optimizer state are sharded across ranks. The model
is built on the meta device, sharded, then materialised: each rank allocates
only its own shards, and ``init_weights`` fills them with exactly the values
an unsharded model gets from the same seed (see ``shardtrain.models.init``;
the order is ``prepare.prepare_model``'s).
"""
import contextlib
import logging
import time

import torch

from shardtrain.core.dtensors import is_dtensor
from shardtrain.trainer.parallel.base import BACKEND_REGISTRY, Backend
from shardtrain.trainer.parallel.fsdp_wrap import (
    apply_fsdp, build_mesh, offload_policy, reshards_after_forward, return_transient_buffers_to_the_os,
)
from shardtrain.trainer.metrics.process_memory import resident_memory_gb

logger = logging.getLogger(__name__)


def _full():
    """Whole (unsharded) state dicts, gathered into host memory. DCP's and FSDP2's imports (~2 s of start-up)
    wait for a run that uses them: this module is imported by every run and refusal, for its class facts."""
    from torch.distributed.checkpoint import state_dict
    return state_dict, state_dict.StateDictOptions(full_state_dict=True, cpu_offload=True)


@BACKEND_REGISTRY.register("fully_sharded")
class FullyShardedBackend(Backend):
    grads_are_averaged = True
    init_on_meta = True
    casts_params = True
    sharded_checkpoints = True
    shards_parameters = True
    supports_cpu_offload = True
    wraps_a_single_rank = True  # one rank still shards (a 1-rank mesh): the same code path as N ranks
    needs_process_group = True  # the mesh lives on a group, even a 1-rank one

    def __init__(self, ctx, distributed, mp_policy=None):
        """``mp_policy``: the dtypes FSDP2 computes and reduces in, as the precision decided them
        (``shardtrain.trainer.precision.decide_dtypes``); None for fp32."""
        super().__init__(ctx, distributed)
        from torch.distributed.fsdp import MixedPrecisionPolicy
        self.mp_policy = mp_policy or MixedPrecisionPolicy()
        return_transient_buffers_to_the_os(ctx.device)
        self.mesh = build_mesh(ctx, distributed.fsdp_sharding_strategy, distributed.shard_group_size)

    @classmethod
    def parameter_shards(cls, distributed, world_size, ranks_per_node):
        """All ranks, or a hybrid strategy's group (--shard-group-size, else a node's ranks)."""
        strategy = distributed.fsdp_sharding_strategy
        if strategy in ("full_shard", "shard_grad_op"):
            return world_size
        if strategy == "no_shard":
            return 1
        return min(distributed.shard_group_size or ranks_per_node, world_size)

    @classmethod
    def plan_variants(cls, name, world_size, ranks_per_node):
        """Sharded over every rank, and hybrid (sharded within a node, replicated across) on several nodes."""
        plain = {"zero_sharding": "none", "fsdp_sharding_strategy": "full_shard"}
        return [(name, plain)] + (
            [(f"{name} hybrid", {**plain, "fsdp_sharding_strategy": "hybrid_shard"})] if world_size > ranks_per_node
            else [])

    @classmethod
    def offloads_state(cls, distributed):
        return distributed.cpu_offload

    @classmethod
    def bytes_communicated(cls, distributed, world_size, count, dtypes, micro_batches, shards):
        """Each micro-batch gathers the parameters (again in backward after resharding) in the compute dtype
        and reduce-scatters the gradients in the reduce dtype within a shard group; across the groups
        (hybrid) one all-reduce of the shards per update."""
        policy = dtypes.policy
        gather = (policy.param_dtype or torch.float32).itemsize
        reduce = (policy.reduce_dtype or torch.float32).itemsize
        gathers = 2 if reshards_after_forward(distributed) else 1  # forward, and again in backward
        per_micro = (shards - 1) / shards * count * (gathers * gather + reduce)
        replicas = world_size // shards
        across = 2 * (replicas - 1) / replicas * count / shards * reduce if replicas > 1 else 0
        return int(micro_batches * per_micro + across)

    def wrap(self, model):
        d = self.distributed
        apply_fsdp(model, self.mesh, self.mp_policy, reshard_after_forward=reshards_after_forward(d),
                   offload=offload_policy(d.cpu_offload, self.device), min_params_to_wrap=d.min_params_to_wrap)
        return model

    @contextlib.contextmanager
    def materialise(self, model):
        start, rss = time.perf_counter(), resident_memory_gb()
        model.to_empty(device=self.optimizer_device)
        for module in model.modules():  # buffers are not offloaded: keep them where compute happens
            for name, buf in module.named_buffers(recurse=False):
                setattr(module, name, buf.to(self.device))
        yield model  # the caller initialises the shards here; logged after, so the memory counts written pages
        logger.info(f"fully_sharded: materialised this rank's shards in {time.perf_counter() - start:.2f}s "
                    f"(resident memory {rss:.2f} -> {resident_memory_gb():.2f} GB, mesh {tuple(self.mesh.shape)})")

    def no_sync(self, module):
        """Accumulation steps. By default every micro-batch reduce-scatters into the sharded
        ``.grad``: skipping it (FSDP2's ``set_requires_gradient_sync(False)``) would keep every
        parameter's unsharded fp32 gradient on every rank until the last micro-batch, the whole
        model's gradients, which sharding and --cpu-offload exist to avoid (fairseq does not skip
        it either). On a 2-D mesh (hybrid_*) only the cross-replica all-reduce waits: the
        reduce-scattered shards accumulate in a sharded buffer until the last micro-batch."""
        if self.distributed.fsdp_unsharded_accumulation:
            return _switched_off(module.set_requires_gradient_sync)
        if self.mesh.ndim == 2:
            return _switched_off(module.set_requires_all_reduce)
        return contextlib.nullcontext()

    def grad_norm(self, params):
        norm = super().grad_norm(params)
        return norm.full_tensor() if is_dtensor(norm) else norm

    def model_state_dict(self, module):
        api, full = _full()
        return api.get_model_state_dict(module, options=full)

    def load_model_state_dict(self, module, state_dict):
        api, full = _full()
        api.set_model_state_dict(module, state_dict, options=full)

    def optimizer_state_dict(self, module, optimizer):
        api, full = _full()
        return api.get_optimizer_state_dict(module, optimizer, options=full)

    def load_optimizer_state_dict(self, module, optimizer, state_dict):
        api, full = _full()
        api.set_optimizer_state_dict(module, optimizer, state_dict, options=full)


@contextlib.contextmanager
def _switched_off(setter):
    """One FSDP2 setting (of the root and every unit below it) off for one accumulation step."""
    setter(False)
    try:
        yield
    finally:
        setter(True)
