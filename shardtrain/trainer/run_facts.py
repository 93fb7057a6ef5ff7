"""The run's facts, decided once from the config and the world (torchtitan's ``ParallelDims`` is the model).

Every fact of a run that more than one room asks is here, worked out by one function (``run_facts``) from the
run's own classes, never from a name: the Backend class and how many ranks a parameter is split over, whether
its state is offloaded and which gradient copies it keeps; the precision (its registered kind) and the dtypes;
activation checkpointing (``--checkpoint-activations``, which offloading implies); ``--update-freq``; what the
optimizer keeps per parameter and whether it steps in CPU memory (its OptimizerSpec); whether ``--async-save``
stages its saves and ``--spike-rollback`` keeps a snapshot. ``Run`` builds them once and hands them to the
backend, the fit check and the ``Trainer``; shard-plan builds them for each configuration it weighs.
"""
import dataclasses
import types
from typing import Optional

import torch

from shardtrain.config.epoch_lists import first
from shardtrain.optim.registry import OptimizerSpec
from shardtrain.trainer.build import optimizer_spec
from shardtrain.trainer.parallel.activation_checkpointing import checkpoint_every
from shardtrain.trainer.parallel.choose import chosen_backend_class
from shardtrain.trainer.parallel.zero import shards_optimizer_state
from shardtrain.trainer.precision.choose import chosen, run_dtypes
from shardtrain.trainer.precision.component import skip_nan
from shardtrain.trainer.precision.registry import Dtypes
from shardtrain.trainer.resolved import Components

# Kinds a checkpoint holds, which --async-save's stager (checkpoint/async_staging.py) copies to host memory
# where they are on the GPU (the model's buffers in it are the non-persistent positions: not saved).
SAVED_KINDS = ("params", "optimizer", "master")


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What a run's classes say about it, for ``world_size`` ranks of ``ranks_per_node`` a node."""
    backend: type  # the Backend class the run builds
    spec: OptimizerSpec  # what the run's optimizer is built from (build.optimizer_spec)
    dtypes: Dtypes
    world_size: int
    shards: int  # ranks a parameter, its gradient and optimizer state are split over
    distributed: object  # the config's distributed section, which the backend's facts read
    staged_kinds: tuple = ()  # what --async-save copies at each save (SAVED_KINDS, or less): none without it
    update_freq: int = 1  # micro-batches an update (--update-freq, its first epoch's; a list or one number)
    snapshot: bool = False  # --spike-rollback keeps a copy of the state beside it (trainer/spike.py)
    precision: type = None  # the registered PrecisionKind (trainer/precision/choose.py): what the dtypes came from
    ranks_per_node: int = 1  # ranks sharing a node (its memory, and a hybrid shard group without --shard-group-size)
    checkpoint_every: Optional[int] = None  # activation checkpointing: every Nth block, None when off
    cpu_step: str = "auto"  # --cpu-step: when a CPU optimizer steps sharded parameters in host memory
    undoable: bool = False  # an update may be undone after backward: --clip-norm, a loss scale, --skip-nan-updates

    @property
    def checkpointed(self) -> bool:
        """Activations are recomputed in backward (--checkpoint-activations, or implied by offloading)."""
        return self.checkpoint_every is not None

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

    def steps_during_backward(self, device_type: str) -> bool:
        """Whether the optimizer steps each shard during backward, as trainer/parallel/step_in_backward.py decides on
        a ``device_type`` run: sharded parameters in host memory (a CPU run's, --cpu-offload's), an optimizer stepping
        there tensor by tensor (cpu_adam on fp32 shards, without --fp16-adam-stats), and --cpu-step during-backward,
        or auto on an accelerator."""
        on_host = device_type == "cpu" or self.state_on_host
        chosen = self.cpu_step == "during-backward" or (self.cpu_step == "auto" and device_type != "cpu")
        by_shard = getattr(self.spec.cls, "steps_on_host", False) and not self.spec.kwargs.get("fp16_adam_stats")
        return bool(self.backend.shards_parameters and on_host and by_shard and self.param_bytes == 4 and chosen)

    def keeps_undo_copies(self, device_type: str) -> bool:
        """The step during backward keeps a copy of each shard's parameter and moments until the update is decided
        (step_in_backward.py's ``keep``): an update that clipping, an overflow or a NaN may undo."""
        return self.undoable and self.steps_during_backward(device_type)


def run_facts(cfg, components: Components, world_size: int, ranks_per_node: int, backend: type = None) -> RunFacts:
    """The facts of ``cfg`` (its ``components`` looked up) on ``world_size`` ranks, ``ranks_per_node`` a node
    (``backend``: the class built, when one is)."""
    backend = backend or chosen_backend_class(cfg, types.SimpleNamespace(world_size=world_size))
    spec = optimizer_spec(cfg, components, torch.device("cpu"))
    shards = backend.parameter_shards(cfg.distributed, world_size, ranks_per_node)
    return RunFacts(backend, spec, run_dtypes(cfg), world_size, shards, cfg.distributed, _staged_kinds(cfg, backend),
                    first(cfg.optimization.update_freq), bool(cfg.optimization.spike_rollback), chosen(cfg.common),
                    ranks_per_node, checkpoint_every(cfg.distributed), cfg.distributed.cpu_step, _undoable(cfg))


def _undoable(cfg) -> bool:
    """An update may be undone once backward has ended (step_in_backward.py's ``keep``, from the same flags): clipped
    (--clip-norm), or skipped (a loss-scaled precision's overflow; --skip-nan-updates or --spike-rollback: skip_nan)."""
    return cfg.optimization.clip_norm > 0 or skip_nan(cfg) > 0 or chosen(cfg.common).loss_scaled


def _staged_kinds(cfg, backend: type) -> tuple:
    """What an --async-save run stages: only a backend that writes sharded checkpoints saves in the background
    (choose.format_for_saving), and nothing is saved under --no-save; the optimizer's state not under
    --no-save-optimizer-state."""
    c = cfg.checkpoint
    if not (c.async_save and backend.sharded_checkpoints) or c.no_save:
        return ()
    return ("params",) if c.no_save_optimizer_state else SAVED_KINDS

