"""Where an update's time goes where the optimizer steps in host memory under a sharded backend
(``--cpu-offload``, or ``fully_sharded`` with ``cpu_adam``): the record fields of docs/precision_and_memory.md.

    offload_fwd_bwd       seconds from the update's first forward to the end of its last backward
    offload_upload        of those, seconds the forwards' shards took to reach the device (backward's gathers are
                          not in it): on an accelerator, the side stream's copies timed by its events where the
                          shards are uploaded ahead (trainer/parallel/upload_ahead.py: one rank), overlapping
                          compute; absent on an accelerator otherwise (FSDP2 copies non-blocking on its own
                          streams, so the host's time in its hook is not the copy's); on a host run, the training
                          thread's time in FSDP2's pre-forward unshards
    offload_grad_wait     seconds the CPU optimizer waited for gradients still being copied to the host
    offload_cpu_step      seconds the CPU optimizer worked: the gradient norm and the step, during backward
                          (the step-in-backward worker) and after it, a clipped redo included
    offload_step_exposed  seconds from backward's end to the update's end: what the step adds to the update
    offload_hidden        percent of offload_cpu_step done before backward's end (its work under backward)

The rest are timed on the host with ``time.perf_counter``: an accelerator's queued work shows where the host
waits for it (the gradients' copies, a norm's ``.item()``), which is where it costs the update time.
"""
import threading
import time
from typing import Callable, Dict, Optional

import torch


_UPLOAD_TIMER = "_offload_upload_seconds"  # on the model: seconds of uploads since the last call


def attach_upload_timer(model: torch.nn.Module, seconds: Callable[[], float]) -> None:
    """``seconds()``: how long the device took to copy the shards uploaded since its last call (the uploader's
    events). The model carries it, as it carries the uploader's hooks."""
    setattr(model, _UPLOAD_TIMER, seconds)


def _device_type(model: torch.nn.Module) -> str:
    """Where a sharded model computes: its parameters' mesh (their shards may sit in host memory)."""
    p = next(model.parameters(), None)
    if p is None:
        return "cpu"
    return p.device_mesh.device_type if hasattr(p, "device_mesh") else p.device.type


class UnshardTimer:
    """Seconds spent in FSDP2's pre-forward hook of every FSDP module of ``model``: a forward pre-hook put in
    front of FSDP2's (prepend) marks its start, one behind it marks its end."""

    def __init__(self, model: torch.nn.Module):
        from torch.distributed.fsdp import FSDPModule
        self.seconds = 0.0
        self._started: Optional[float] = None
        self._handles = []
        for module in model.modules():
            if isinstance(module, FSDPModule):
                self._handles.append(module.register_forward_pre_hook(self._start, prepend=True))
                self._handles.append(module.register_forward_pre_hook(self._end))

    def _start(self, module, args) -> None:
        self._started = time.perf_counter()

    def _end(self, module, args) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class StepClock:
    """Stretches of CPU optimizer work (start, end) and seconds of waiting for gradients, added from any thread
    (the step-in-backward worker's too)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.stretches, self.waiting = [], 0.0

    def worked(self, start: float, end: float) -> None:
        with self._lock:
            self.stretches.append((start, end))

    def waited(self, seconds: float) -> None:
        with self._lock:
            self.waiting += seconds

    def take(self):
        """(stretches, waiting) since the last take."""
        with self._lock:
            taken = (self.stretches, self.waiting)
            self.stretches, self.waiting = [], 0.0
        return taken


class OffloadTimes:
    """One update's split, for the Trainer: ``begin`` before its first forward, ``backward_done`` after its last
    backward, ``stepping`` around each stretch of optimizer work on the training thread, ``fields`` at its end."""

    def __init__(self, model: torch.nn.Module, clock: StepClock):
        self.clock = clock  # shared with the step-in-backward worker, which adds its own stretches
        self.unshards = UnshardTimer(model)
        self._uploads: Optional[Callable[[], float]] = getattr(model, _UPLOAD_TIMER, None)
        self._upload_counted = self._uploads is not None or _device_type(model) == "cpu"
        self._begin = self._backward_done = 0.0

    def begin(self) -> None:
        self.clock.take()  # nothing from before this update
        self.unshards.seconds = 0.0
        if self._uploads is not None:
            self._uploads()  # the uploads before this update (a validation's forward) are not its own
        self._begin = time.perf_counter()

    def backward_done(self) -> None:
        self._backward_done = time.perf_counter()

    def stepping(self):
        """A context: the optimizer works on the training thread (the norm, a step, an undo and redo)."""
        return _Stretch(self.clock)

    def fields(self) -> Dict[str, float]:
        end = time.perf_counter()
        stretches, waiting = self.clock.take()
        working = sum(b - a for a, b in stretches)
        under_backward = sum(max(0.0, min(b, self._backward_done) - a) for a, b in stretches)
        exposed = end - self._backward_done
        hidden = 100.0 * under_backward / working if working > 0 else 0.0
        fields = {"offload_fwd_bwd": self._backward_done - self._begin, "offload_grad_wait": waiting,
                  "offload_cpu_step": working, "offload_step_exposed": exposed, "offload_hidden": hidden}
        if self._upload_counted:
            fields["offload_upload"] = self._uploads() if self._uploads is not None else self.unshards.seconds
        return fields

    def close(self) -> None:
        self.unshards.close()


class _Stretch:
    def __init__(self, clock: StepClock):
        self.clock = clock

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.clock.worked(self.start, time.perf_counter())
