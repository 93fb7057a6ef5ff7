"""Stand-ins for a GPU on a CPU machine, for tests of code paths that only a GPU takes.

``CudaRecorder`` makes ``torch.cuda`` say it is available and records every call that would
create a CUDA context or touch a device, with the thread that made it and the device it would
touch: the thread's current device, 0 until ``set_device`` in that thread (CUDA's current device
is per thread). The calls return stand-in streams, so the code under test runs on.

``GpuHostMemory`` is a ``HostMemory`` (async_staging.py) for a rank whose state is on a GPU: it
reports every tensor as on that device and records the buffers it allocates (pinned or not), the
copies (non-blocking or not) and the waits, each with its thread; the bytes are copied for real.
"""
import threading

import torch

from shardtrain.trainer.checkpoint.async_staging import HostMemory

CONTEXT_CALLS = ("current_stream", "default_stream", "synchronize", "set_device", "init", "_lazy_init",
                 "current_device", "stream", "Stream", "Event", "device")
ACCELERATOR_CALLS = ("current_stream", "synchronize", "set_device_index", "current_device_index")


class FakeStream:
    """Enough of a stream for DCP's overlapping loader (equality, context manager, waits)."""

    def __init__(self, recorder, device):
        self.recorder, self.device, self.device_type = recorder, device, "cuda"

    def synchronize(self):
        self.recorder.record("Stream.synchronize", self.device)

    def wait_stream(self, other):
        self.recorder.record("Stream.wait_stream", self.device)

    def __eq__(self, other):
        return isinstance(other, FakeStream) and other.device == self.device

    def __hash__(self):
        return hash(self.device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class CudaRecorder:
    """Install with ``CudaRecorder(monkeypatch)``; read ``calls``: [(what, thread name, device index)]."""

    def __init__(self, monkeypatch):
        self.calls = []
        self._current = threading.local()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
        # torch 2.11's optimizer step asks this whenever CUDA is available; it creates no context
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        for name in CONTEXT_CALLS:
            monkeypatch.setattr(torch.cuda, name, self._recording(f"torch.cuda.{name}"))
        for name in ACCELERATOR_CALLS:
            monkeypatch.setattr(torch.accelerator, name, self._recording(f"torch.accelerator.{name}"))

    def current_device(self) -> int:
        return getattr(self._current, "index", 0)

    def record(self, what, device=None):
        self.calls.append((what, threading.current_thread().name, self.current_device() if device is None else device))

    def _recording(self, what):
        def call(*args, **kwargs):
            if what.endswith(("set_device", "set_device_index")):
                device = args[0]
                self._current.index = device.index if isinstance(device, torch.device) else int(device)
            self.record(what)
            return FakeStream(self, self.current_device())
        return call


class GpuHostMemory(HostMemory):
    """Staging's device side for a rank whose state lives on ``device`` (see the module's docstring)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.allocated, self.copies, self.waits = [], [], []

    def device_of(self, tensor):
        return self.device

    def allocate(self, like, pinned):
        self.allocated.append((tuple(like.shape), like.dtype, pinned))
        return torch.empty(like.shape, dtype=like.dtype)  # pinning needs a GPU: recorded above instead

    def copy(self, buffer, source, non_blocking):
        self.copies.append((buffer.data_ptr(), non_blocking))
        buffer.copy_(source)

    def synchronize(self, device):
        self.waits.append((device, threading.current_thread().name))
