"""What ``--async-save`` copies before ``save()`` returns, and what it writes in place.

An async save must not write a mix of two updates: the next optimizer step
changes every parameter and every moment in place. There are two ways to keep
the write whole, and each kind of tensor gets the cheaper one:

- **Accelerator tensors are copied** to host memory before ``save()`` returns
  (the write needs them on the host anyway). One ``DefaultStager`` serves the
  run: it keys its buffers by the source storage, so the first save allocates
  them (pinned, copies non-blocking) and later saves refill the same memory.
- **CPU tensors that only an optimizer step changes** (parameters and optimizer
  state, all of it under ``--cpu-offload``) are written from the live tensors,
  and the next optimizer step waits until the write has landed
  (``StepGate``). Forward and backward only read them, so they overlap the
  write. Copying them instead would hold a second copy of the state in host
  RAM during every save: ~150 GB more for a 13B model under offload, where
  host RAM is what binds. The price is a stall of (write time - forward and
  backward) when the write is the slower, measured in benchmarks/async_save.py.
- Any other CPU tensor (a buffer a forward pass may update, a scalar step
  count) is copied: they are small and nothing gates their writers.

Containers and plain values are copied too: the lr scheduler changes an
optimizer's param_groups between steps, and DCP reads them in the background.

torch's stagers copy everything (DefaultStager) or nothing; the split between
the two is what they lack, hence this module.
"""
import copy
import threading
from typing import Any, Dict, Iterator, Optional, Set

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.optim.optimizer import register_optimizer_step_pre_hook


def staging_options(device: torch.device) -> StagingOptions:
    """How to copy tensors that live on ``device``."""
    on_accelerator = device.type != "cpu"
    return StagingOptions(use_pinned_memory=device.type == "cuda",  # pinning is a CUDA host allocation
                          use_shared_memory=False,  # the writer is a thread of this process
                          use_async_staging=False,  # the copy is whole before save() returns
                          use_non_blocking_copy=on_accelerator)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _storage(tensor: torch.Tensor) -> int:
    return _local(tensor).untyped_storage().data_ptr()


def step_only_storages(model: torch.nn.Module, optimizer_state: Dict) -> Set[int]:
    """Storages that only an optimizer step changes: the parameters' and, in the
    optimizer's state dict, everything under ``state`` (moments, step counts)."""
    found = {_storage(p) for p in model.parameters()}
    found.update(_storage(t) for t in _tensors(optimizer_state.get("state", {})))
    found.discard(0)  # empty storages share address 0
    return found


def _tensors(value) -> Iterator[torch.Tensor]:
    """Every tensor in a nest of dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (dict, list, tuple)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _tensors(item)


class RunStager:
    """The run's stager: copies what must be copied into buffers reused by every
    save; leaves CPU tensors in ``in_place`` storages to be written live.

    ``copy_everything=True`` copies every tensor (the behaviour before; kept
    for benchmarks/async_save.py to compare against)."""

    def __init__(self, copy_everything: bool = False):
        self.copy_everything = copy_everything
        self._copier: Optional[DefaultStager] = None
        self.created = 0  # copiers made over the run: at most 1 however many saves
        self.in_place_bytes = 0  # of the last save: written from the live tensors
        self.copied_bytes = 0  # of the last save: copied first

    def stage(self, state: Any, in_place: Set[int]) -> Any:
        """``state`` with every tensor to copy replaced by its staged copy."""
        to_copy: Dict[int, torch.Tensor] = {}
        self.in_place_bytes = self.copied_bytes = 0

        for tensor in _tensors(state):
            local = _local(tensor)
            nbytes = local.numel() * local.element_size()
            # scalars (Adam's step counts, on the CPU even for GPU state) are copied: gating
            # the step on a write of bytes would stall GPU runs for nothing
            live = local.device.type == "cpu" and local.numel() > 1 and _storage(local) in in_place
            if live and not self.copy_everything:
                self.in_place_bytes += nbytes
            else:
                to_copy[id(tensor)] = tensor
                self.copied_bytes += nbytes
        copies = self._copier_for(to_copy.values()).stage(to_copy) if to_copy else {}

        def rebuild(value):
            if isinstance(value, torch.Tensor):
                return copies.get(id(value), value)
            if isinstance(value, dict):
                return {key: rebuild(item) for key, item in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(rebuild(item) for item in value)
            return copy.deepcopy(value)

        return rebuild(state)

    def _copier_for(self, tensors) -> DefaultStager:
        if self._copier is None:
            devices = {_local(t).device for t in tensors}
            accelerator = next((d for d in devices if d.type != "cpu"), torch.device("cpu"))
            self._copier = DefaultStager(staging_options(accelerator))
            self.created += 1
        return self._copier

    def close(self) -> None:
        """Free the buffers (after the last save has been written)."""
        if self._copier is not None:
            self._copier.close()
            self._copier = None


class Prestaged:
    """An ``AsyncStager`` for ``dcp.async_save`` whose state was staged already
    (by ``RunStager.stage``, which needs to know what to leave in place)."""

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False  # staging was synchronous: nothing to wait for

    def stage(self, state_dict):
        return state_dict

    def synchronize_staging(self) -> None:
        pass

    def close(self) -> None:
        pass


class StepGate:
    """Holds every optimizer step until a background write of live tensors has landed.

    A global step pre-hook (torch.optim's own) rather than one on the trainer's
    optimizer: wrappers (ZeRO, precision) step an inner optimizer, and any step
    of any of them may change the tensors being written. ``hold()`` before the
    write, ``release()`` when it has landed (from the writer's thread), then
    ``detach()`` on the training thread (torch iterates the hooks while it calls
    them, so the hook cannot remove itself)."""

    def __init__(self):
        self._released = threading.Event()
        self._released.set()
        self._handle = None
        self.waited = 0  # steps that found the write still running and waited

    def hold(self) -> None:
        """Make the next optimizer steps wait, until ``release()``."""
        self._released.clear()
        if self._handle is None:
            self._handle = register_optimizer_step_pre_hook(self._before_step)

    def release(self) -> None:
        """The write has landed (or failed: the failure is reported elsewhere); any thread."""
        self._released.set()

    def detach(self) -> None:
        """Training thread, after ``release()``: remove the hook."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _before_step(self, optimizer, args, kwargs) -> None:
        if not self._released.is_set():
            self.waited += 1
            self._released.wait()
