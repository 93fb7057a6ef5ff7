"""One rank's memory on each device, from its bytes by kind: the accounting that shard-plan
(``shardtrain.plan.estimate``, from a traced step) and the pre-launch fit check (``memory_fit``, from a
meta build) share, so the two cannot disagree on where a run keeps what.

Every fact comes from the run's own classes, never from a name: how many ranks a parameter is split
over, whether its state is offloaded and which gradient copies a backend keeps (the Backend class), how
many bytes of state the optimizer keeps per parameter and whether it steps in CPU memory (its
OptimizerSpec), the dtypes (the precision's ``run_dtypes``), whether --async-save stages its saves
(the backend writes sharded checkpoints).
"""
import dataclasses
import types
from typing import Dict

import torch

from shardtrain.config.epoch_lists import first
from shardtrain.optim.registry import OptimizerSpec
from shardtrain.trainer.build import optimizer_spec
from shardtrain.trainer.parallel.choose import chosen_backend_class
from shardtrain.trainer.parallel.zero import shards_optimizer_state
from shardtrain.trainer.precision.choose import run_dtypes
from shardtrain.trainer.precision.registry import Dtypes
from shardtrain.trainer.resolved import Components

# Kinds a snapshot (--spike-rollback, trainer/spike.py) copies; each copy lies beside its original.
SNAPSHOT_KINDS = ("params", "optimizer", "master", "buffers")
# Kinds a checkpoint holds, which --async-save's stager (checkpoint/async_staging.py) copies to host memory
# where they are on the GPU (the model's buffers in it are the non-persistent positions: not saved).
SAVED_KINDS = ("params", "optimizer", "master")


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What a run's classes say about its memory, for ``world_size`` ranks."""
    backend: type  # the Backend class the run builds
    spec: OptimizerSpec  # what the run's optimizer is built from (build.optimizer_spec)
    dtypes: Dtypes
    world_size: int
    shards: int  # ranks a parameter, its gradient and optimizer state are split over
    distributed: object  # the config's distributed section, which the backend's facts read
    staged_kinds: tuple = ()  # what --async-save copies at each save (SAVED_KINDS, or less): none without it
    update_freq: int = 1  # micro-batches an update (--update-freq, its first epoch's; a list or one number)

    @property
    def param_bytes(self) -> int:
        """Bytes a parameter (and its gradient) is stored in."""
        return (self.dtypes.storage or torch.float32).itemsize

    @property
    def zero_shards(self) -> int:
        """Ranks ZeRO (--zero-sharding os) splits the optimizer state over, beyond the parameters' own."""
        if self.backend.shards_parameters or not shards_optimizer_state(self.distributed.zero_sharding,
                                                                        self.world_size):
            return 1
        return self.world_size

    @property
    def state_on_host(self) -> bool:
        """Parameter shards and gradients in host memory (a GPU run's)."""
        return bool(self.backend.offloads_state(self.distributed))

    @property
    def optimizer_on_host(self) -> bool:
        """Optimizer state (and master copies) in host memory: offloaded, or an optimizer stepping there."""
        return self.state_on_host or self.spec.steps_on_cpu


def run_facts(cfg, components: Components, world_size: int, ranks_per_node: int, backend: type = None) -> RunFacts:
    """The facts of ``cfg`` (its ``components`` looked up) on ``world_size`` ranks (``backend``: the class
    built, when one is)."""
    backend = backend or chosen_backend_class(cfg, types.SimpleNamespace(world_size=world_size))
    spec = optimizer_spec(cfg, components, torch.device("cpu"))
    shards = backend.parameter_shards(cfg.distributed, world_size, ranks_per_node)
    return RunFacts(backend, spec, run_dtypes(cfg), world_size, shards, cfg.distributed, _staged_kinds(cfg, backend),
                    first(cfg.optimization.update_freq))


def _staged_kinds(cfg, backend: type) -> tuple:
    """What an --async-save run stages: only a backend that writes sharded checkpoints saves in the background
    (choose.format_for_saving), and nothing is saved under --no-save; the optimizer's state not under
    --no-save-optimizer-state."""
    c = cfg.checkpoint
    if not (c.async_save and backend.sharded_checkpoints) or c.no_save:
        return ()
    return ("params",) if c.no_save_optimizer_state else SAVED_KINDS


def staged_bytes(facts: RunFacts, kinds: Dict[str, int], device_type: str) -> int:
    """Host bytes --async-save's stager keeps for the whole run (allocated at the first save, pinned, refilled
    at every later one, freed when the run ends): a copy of each saved kind the rank keeps on its GPU. State in
    host memory (a CPU run's, --cpu-offload's, cpu_adam's) is written from the live tensors, never copied."""
    saved = {kind: kinds[kind] for kind in facts.staged_kinds}
    return place(saved, device_type, facts.state_on_host, facts.optimizer_on_host, snapshot=False)["device"]


def gradient_copy_bytes(facts: RunFacts, grads: int, after_backward: int, peak: int) -> int:
    """Bytes the backend's own gradient copies add to a step whose peak is ``peak``: those held through
    backward add to it; one made after backward, beside ``after_backward`` bytes then live, only as far as
    it passes the peak."""
    if facts.world_size == 1:
        return 0
    copies = facts.backend.gradient_copies(facts.distributed)
    extra = copies.during_backward * grads
    if copies.after_backward:
        extra += max(0, after_backward + copies.after_backward * grads - peak)
    return extra


def place(kinds: Dict[str, int], device_type: str, state_on_host: bool, optimizer_on_host: bool,
          snapshot: bool) -> Dict[str, int]:
    """{"host": bytes, "device": bytes} of one rank holding ``kinds`` ("params", "grads", "optimizer",
    "master", "buffers", "bookkeeping" (host memory of the tensor objects), any other kind: the compute
    device's), the parameters and gradients in host memory when ``state_on_host``, the optimizer's state
    and master copies when ``optimizer_on_host`` (RunFacts says both); with a --spike-rollback
    ``snapshot``, a copy of SNAPSHOT_KINDS beside each original. A CPU run holds everything in host memory."""
    on_host = {"bookkeeping": True, "params": state_on_host, "grads": state_on_host,
               "optimizer": optimizer_on_host, "master": optimizer_on_host}
    out = {"host": 0, "device": 0}
    for kind, size in kinds.items():
        copies = 2 if snapshot and kind in SNAPSHOT_KINDS else 1
        where = "host" if device_type == "cpu" or on_host.get(kind, False) else "device"
        out[where] += copies * size
    return out
