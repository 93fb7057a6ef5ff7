"""What ``--async-save`` copies before ``save()`` returns, and what it writes in place.

An async save must not write a mix of two updates: the next optimizer step
changes every parameter and every moment in place. There are two ways to keep
the write whole, and each kind of tensor gets the cheaper one:

- **Accelerator tensors are copied** to host memory before ``save()`` returns
  (the write needs them on the host anyway), into buffers this module owns
  (``RunStager``): the first save allocates them (pinned for CUDA sources, so
  the copies run non-blocking, then one synchronize per source device), later
  saves refill the same memory, ``close()`` drops them. torch's own stager
  cached them privately and, from torch 2.11 on, drops that cache after every
  stage (hence a ``KeyError`` at the second save when we reused it).
- **CPU tensors that only an optimizer step changes** (parameters and optimizer
  state, all of it under ``--cpu-offload`` or ``--cpu``) are written from the
  live tensors, and the next optimizer step waits until the write has landed
  (``StepGate``); so does anything else that writes them in place
  (``wait_for_live_writes``: a ``--spike-rollback`` restore). Forward and
  backward only read them, so they overlap the write. Copying them instead
  would hold a second copy of the state in host RAM during every save: ~150 GB
  more for a 13B model under offload, where host RAM is what binds. The price
  is a stall of (write time - forward and backward) when the write is the
  slower, measured in benchmarks/async_save.py.
- Any other CPU tensor (a buffer a forward pass may update, a scalar step
  count) is copied: they are small and nothing gates their writers.

Containers and plain values are copied too: the lr scheduler changes an
optimizer's param_groups between steps, and DCP reads them in the background.

torch's stagers copy everything or nothing; the split between the two is what
they lack, hence this module.
"""
import copy
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, Optional, Set, Tuple

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from shardtrain.core.dtensors import is_dtensor, local_tensor
from shardtrain.core.torch_private import dtensor_around


def _storage(tensor: torch.Tensor) -> int:
    return local_tensor(tensor).untyped_storage().data_ptr()


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


def on_host(state: Any) -> bool:
    """Whether every tensor of ``state`` (its local shard, for a DTensor) is in host memory."""
    return all(local_tensor(t).device.type == "cpu" for t in _tensors(state))


def _rebuild(value, path: str, tensor_fn: Callable[[str, torch.Tensor], torch.Tensor]):
    """``value`` with each tensor replaced by ``tensor_fn(its path, it)`` and everything else deep-copied."""
    if isinstance(value, torch.Tensor):
        return tensor_fn(path, value)
    if isinstance(value, dict):
        return {key: _rebuild(item, f"{path}/{key}", tensor_fn) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild(item, f"{path}/{i}", tensor_fn) for i, item in enumerate(value))
    return copy.deepcopy(value)


class HostMemory:
    """The device side of staging, in one place: which device a tensor is on, a host buffer for
    it, the copy and the wait for it (tests/trainer/checkpoint/cuda_stand_in.py stands in for a GPU here)."""

    def device_of(self, tensor: torch.Tensor) -> torch.device:
        return tensor.device

    def allocate(self, like: torch.Tensor, pinned: bool) -> torch.Tensor:
        # pinned: a copy into pageable memory cannot run asynchronously. torch's pinned allocator
        # rounds each block up to a power of two (by arithmetic, 1.02x the bytes for a 1.3B model's
        # shapes, 1.7x for a 13B's) and keeps freed blocks cached for its next pinned allocation
        return torch.empty(like.shape, dtype=like.dtype, pin_memory=pinned)

    def copy(self, buffer: torch.Tensor, source: torch.Tensor, non_blocking: bool) -> None:
        buffer.copy_(source, non_blocking=non_blocking)

    def synchronize(self, device: torch.device) -> None:
        """The non-blocking copies from ``device`` were queued on its current stream: wait for them."""
        torch.accelerator.current_stream(device).synchronize()


class RunStager:
    """The run's stager: copies what must be copied into host buffers it owns and reuses
    for every save; leaves CPU tensors in ``in_place`` storages to be written live.

    A buffer belongs to a place in the state dict (``model/decoder.layers.0.fc1.weight``),
    so the same entry refills it at every save even when the state dict hands out fresh
    tensor objects; it is allocated again only when that entry's shape, dtype or device
    kind changes, and dropped when the entry is gone or at ``close()``. Entries that share
    one source (tied weights) share one copy."""

    def __init__(self, memory: Optional[HostMemory] = None):
        self.memory = memory or HostMemory()
        self._buffers: Dict[str, Tuple[torch.Tensor, bool]] = {}  # path -> (buffer, pinned)
        self.allocations = 0  # buffers allocated over the run: none after the first save of an unchanged state
        self.in_place_bytes = 0  # of the last save: written from the live tensors
        self.copied_bytes = 0  # of the last save: copied first

    def stage(self, state: Any, in_place: Set[int]) -> Any:
        """``state`` with every tensor to copy replaced by its copy, whole when this returns."""
        self.in_place_bytes = self.copied_bytes = 0
        kept: Dict[str, Tuple[torch.Tensor, bool]] = {}
        copies: Dict[tuple, torch.Tensor] = {}  # by source: aliases share a copy
        waits: Set[torch.device] = set()  # devices with non-blocking copies queued

        def staged(path: str, tensor: torch.Tensor) -> torch.Tensor:
            local = local_tensor(tensor)
            device = self.memory.device_of(local)
            nbytes = local.numel() * local.element_size()
            # scalars (Adam's step counts, on the CPU even for GPU state) are copied: gating
            # the step on a write of bytes would stall GPU runs for nothing
            live = device.type == "cpu" and local.numel() > 1 and _storage(local) in in_place
            if live:
                self.in_place_bytes += nbytes
                return tensor
            self.copied_bytes += nbytes
            source = (local.device, local.data_ptr(), tuple(local.shape), local.stride(), local.dtype)
            if source not in copies:
                copies[source] = self._fill(path, local, device, kept, waits)
            return dtensor_around(tensor, copies[source]) if is_dtensor(tensor) else copies[source]

        result = _rebuild(state, "", staged)
        for device in waits:  # one wait per source device, before save() returns
            self.memory.synchronize(device)
        self._buffers = kept  # a buffer no entry used this time is dropped
        return result

    def _fill(self, path: str, local: torch.Tensor, device: torch.device, kept: Dict,
              waits: Set[torch.device]) -> torch.Tensor:
        pinned = device.type == "cuda"  # pinning is a CUDA host allocation
        while path in kept:  # another source spelled this path ("a/b", or "b" in "a"; 0 and "0"): its own buffer,
            path += "'"  # found again at the next save, as entries come in the same order
        buffer, was_pinned = self._buffers.get(path, (None, None))
        if buffer is None or buffer.shape != local.shape or buffer.dtype != local.dtype or was_pinned != pinned:
            buffer = self.memory.allocate(local, pinned)
            self.allocations += 1
        kept[path] = (buffer, pinned)
        self.memory.copy(buffer, local, non_blocking=pinned)
        if pinned:
            waits.add(device)
        return buffer

    def buffers(self) -> Dict[str, torch.Tensor]:
        """The buffers held now, by state-dict path (tests)."""
        return {path: buffer for path, (buffer, _) in self._buffers.items()}

    def close(self) -> None:
        """Free the buffers (after the last save has been written)."""
        self._buffers = {}


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


# Gates whose write of live tensors may still run. Process-wide, as the gate's hook is: whatever
# changes those tensors in place (a --spike-rollback restore) need not know which saver wrote them.
_HELD: "weakref.WeakSet[StepGate]" = weakref.WeakSet()


def wait_for_live_writes() -> int:
    """Block until every background write of live tensors in this process has landed; -> how many
    were still running. For in-place changes of parameters or optimizer state outside an optimizer
    step (the steps wait by themselves)."""
    return sum(gate.wait() for gate in list(_HELD))


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
        self.waited = 0  # steps (and other in-place writers) that found the write still running and waited

    def hold(self) -> None:
        """Make the next optimizer steps wait, until ``release()``."""
        self._released.clear()
        _HELD.add(self)
        if self._handle is None:
            self._handle = register_optimizer_step_pre_hook(self._before_step)

    def release(self) -> None:
        """The write has landed (or failed: the failure is reported elsewhere); any thread."""
        self._released.set()

    def detach(self) -> None:
        """Training thread, after ``release()``: remove the hook."""
        _HELD.discard(self)
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def wait(self) -> int:
        """Block until the write has landed; -> 1 if it was still running, else 0."""
        if self._released.is_set():
            return 0
        self.waited += 1
        self._released.wait()
        return 1

    def _before_step(self, optimizer, args, kwargs) -> None:
        self.wait()
