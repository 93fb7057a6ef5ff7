"""``--zero-sharding os``: optimizer state sharded over the data-parallel ranks (ZeRO stage 1).

torch's ``ZeroRedundancyOptimizer`` gives each rank the optimizer of about 1/N
of the parameters (whole tensors, balanced by size); after each rank steps its
share, it broadcasts the updated parameters to the others. Gradients and
parameters stay whole on every rank, so it composes with pytorch_ddp and
legacy_ddp unchanged, and clipping sees the whole gradient as before.

Its own state dicts do not fit the backends' name-keyed checkpoints:
``state_dict()`` raises unless ``consolidate_state_dict()`` ran first, and then
only on the target rank, which keeps the consolidated copy; ``load_state_dict()``
indexes parameters by position only (DCP's name-keyed dicts raise a TypeError),
writes ``None`` into its argument for other ranks' parameters, loads the state a
second time into the wrapper's otherwise unused ``state``, and puts every 0-d
tensor (Adam's ``step``) on the CPU, where torch's own loading puts it on the
parameter's device for fused and capturable kernels. And the wrapper's
``state`` stays empty, so memory accounting sees no state and DCP, which steps
an optimizer with an empty ``state`` to initialise it, takes an extra Adam step
before it asks for the state. :class:`ShardedStateOptimizer` fixes these at the boundary.
"""
import itertools
from typing import Any, Dict, List

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from shardtrain.core.errors import ConfigError
from shardtrain.optim.registry import OptimizerSpec


class ShardedStateOptimizer(ZeroRedundancyOptimizer):
    """``ZeroRedundancyOptimizer(params, optimizer_class=spec.cls, lr=lr, **spec.kwargs)`` that
    speaks torch's standard optimizer state dict.

    ``state_dict()`` is a collective (every rank must call it) and returns, on every
    rank, the whole state indexed over all parameters, as the unsharded optimizer
    does: rank 0 saves it, and a rank's dict may be a template that DCP fills
    (``get_optimizer_state_dict`` then ``dcp.load`` when a fully_sharded
    checkpoint is resumed), which needs every parameter's entry on every rank. So
    during a save each rank briefly holds a CPU copy of the other ranks' shards.
    ``load_state_dict()`` takes the whole state (from any world size, with or
    without ZeRO) and keeps this rank's shard; it communicates nothing.
    """

    def __init__(self, params, spec: OptimizerSpec, lr: float):
        params = list(params)
        # A rank without parameters would have no state, and DCP steps an optimizer without
        # state on its own at a save: a collective in ZeRO's step that the other ranks never join.
        if dist.get_world_size() > len(params):
            raise ConfigError(
                f"--zero-sharding os gives each rank whole parameter tensors, but the model has only {len(params)} "
                f"trained tensors for {dist.get_world_size()} ranks. Drop --zero-sharding, or train on at most "
                f"{len(params)} ranks.")
        super().__init__(params, optimizer_class=spec.cls, lr=lr, **spec.kwargs)
        self.state = self.optim.state  # this rank's shard is what it holds (and what step() fills)

    def state_dict(self) -> Dict[str, Any]:
        # Optimizer's packing over this wrapper's param_groups (all parameters) turns
        # the shard in self.state into global indices.
        own = torch.optim.Optimizer.state_dict(self)
        merged = {}
        for rank in range(self.world_size):
            # One shard at a time, as a CPU copy: under NCCL each broadcast stages its bytes on
            # the GPU, so all_gather_object would hold every shard there at once; and a CUDA
            # tensor would be unpickled onto the sender's device index.
            shard = [_to_cpu(own["state"]) if rank == self.rank else None]
            dist.broadcast_object_list(shard, group=self.process_group, group_src=rank)
            merged.update(own["state"] if rank == self.rank else shard[0])
        own["state"] = dict(sorted(merged.items()))
        return own

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        saved_groups = state_dict["param_groups"]
        _check_same_shape(saved_groups, self.param_groups)
        # Saved parameters are keys (indices, or names from DCP) in the order of the saved
        # groups; they map by position to ours, as torch.optim.Optimizer maps them.
        saved_keys = itertools.chain.from_iterable(g["params"] for g in saved_groups)
        param_of = dict(zip(saved_keys, itertools.chain.from_iterable(g["params"] for g in self.param_groups)))
        local_index = {p: i for i, p in enumerate(itertools.chain.from_iterable(
            g["params"] for g in self.optim.param_groups))}
        local_state = {local_index[param_of[k]]: v for k, v in state_dict["state"].items()
                       if param_of[k] in local_index}
        local_groups = [{**_hyperparameters(saved), "params": [local_index[p] for p in local["params"]]}
                        for saved, local in zip(saved_groups, self.optim.param_groups)]
        # The local optimizer's own load applies torch's casting rules (dtype, device, `step`).
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self.optim.state  # load_state_dict replaced the dict
        for group, saved in zip(self.param_groups, saved_groups):
            group.update(_hyperparameters(saved))

    def describe(self) -> str:
        """One line for the log: what this rank holds."""
        own = [p for g in self.optim.param_groups for p in g["params"]]
        every = [p for g in self.param_groups for p in g["params"]]
        return (f"--zero-sharding os: {self.optim.__class__.__name__} state sharded over {self.world_size} ranks; "
                f"rank {self.rank} holds the state of {len(own)} of {len(every)} parameter tensors "
                f"({sum(p.numel() for p in own):,} of {sum(p.numel() for p in every):,} elements)")


def _hyperparameters(group: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def _check_same_shape(saved_groups: List[Dict], groups: List[Dict]) -> None:
    # torch.optim.Optimizer.load_state_dict's checks and messages (resume.py reports ValueErrors)
    if len(saved_groups) != len(groups):
        raise ValueError("loaded state dict has a different number of parameter groups")
    if any(len(s["params"]) != len(g["params"]) for s, g in zip(saved_groups, groups)):
        raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                         "optimizer's group")


def _to_cpu(value):
    if torch.is_tensor(value):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
