"""Moves a chunked parameter's gradient chunks to the CPU and its updated chunks back.

:class:`~shardtrain.optim.cpu_adam.CPUAdam` steps parameters that live on an
accelerator (its master-copy path) chunk by chunk on the CPU. Copied
synchronously through pageable memory, the accelerator and the CPU take turns;
here the copies go through pinned buffers, two of each kind, so that chunk i+1's
gradient is on its way while chunk i is stepped, and chunk i's update goes back
while chunk i+1 is stepped.

Every copy is issued on the device's *current* stream: after the backward pass
that wrote the gradients and before whatever later reads the parameter (the next
forward), with no cross-stream bookkeeping. A non_blocking copy returns before
the data has moved, so an event per buffer says when it has: a gradient buffer
is read only after its event, and an update buffer is refilled only after the
copy out of it has finished (refilling it earlier would corrupt the parameter).
"""
from typing import Dict, List, Optional, Tuple

import torch


def _is_accelerator(device: torch.device) -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and device.type == accelerator.type


class ChunkPipe:
    """Chunk transfers between ``device`` and the CPU for one optimizer step.

    ``staged`` (default: ``device`` is the accelerator) copies through the
    double buffers, pinned on an accelerator; unstaged, :meth:`fetch` hands the
    chunk through as it is and :meth:`put` copies synchronously, as on the CPU.
    Tests stage CPU tensors to check the buffering gives the same values.
    """

    def __init__(self, device: torch.device, staged: Optional[bool] = None):
        self.device = torch.device(device)
        self.staged = _is_accelerator(self.device) if staged is None else staged
        self._pinned = self.staged and self.device.type != "cpu"
        self._buffers: Dict[Tuple[str, int], torch.Tensor] = {}
        self._events: Dict[Tuple[str, int], torch.Event] = {}
        self._fetched: List[Optional[torch.Tensor]] = [None, None]

    def fetch(self, index: int, chunk: torch.Tensor) -> None:
        """Start moving chunk ``index`` (a gradient view) to the CPU."""
        slot = index % 2
        if not self.staged:
            self._fetched[slot] = chunk
            return
        buffer = self._buffer(("grad", slot), chunk.shape, chunk.dtype)
        # Its previous chunk (index - 2) was taken and stepped: the buffer is free.
        self._fetched[slot] = buffer.copy_(chunk, non_blocking=self._pinned)
        self._record(("grad", slot))

    def take(self, index: int) -> torch.Tensor:
        """Chunk ``index`` on the CPU, once its copy has landed."""
        slot = index % 2
        self._wait(("grad", slot))
        return self._fetched[slot]

    def put(self, index: int, target: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``values`` (CPU) into ``target`` (a parameter view on the device)."""
        if not self.staged:
            target.copy_(values)  # to the parameter's device and dtype
            return
        key = ("out", index % 2)
        self._wait(key)  # the copy out of this buffer two chunks ago must have finished
        # Rounded to the parameter's dtype here: fewer bytes over the bus, the same rounding.
        buffer = self._buffer(key, target.shape, target.dtype).copy_(values)
        target.copy_(buffer, non_blocking=self._pinned)
        self._record(key)

    def finish(self) -> None:
        """Wait for every copy still in flight: the step has updated the parameters when it returns."""
        for key in list(self._events):
            self._wait(key)

    def _buffer(self, key, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        numel = shape.numel()
        buffer = self._buffers.get(key)
        if buffer is None or buffer.dtype != dtype or buffer.numel() < numel:
            buffer = self._buffers[key] = torch.empty(numel, dtype=dtype, pin_memory=self._pinned)
        return buffer[:numel].view(shape)

    def _record(self, key) -> None:
        if self._pinned:
            event = self._events[key] = torch.Event(device=self.device)
            # The copy ran on the current stream of the tensor's device, which may not be the current device.
            event.record(torch.accelerator.current_stream(self.device))

    def _wait(self, key) -> None:
        event = self._events.pop(key, None)
        if event is not None:
            event.synchronize()
