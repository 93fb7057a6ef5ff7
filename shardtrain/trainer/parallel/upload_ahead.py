"""Under --cpu-offload on a 1-rank shard group: the next blocks' shards copied to the device ahead, on a side stream.

With one rank FSDP2 gathers nothing: it copies each block's offloaded fp32 shard to the device on the compute
stream when the block's forward starts (``FSDPParamGroup.wait_for_unshard``), so its prefetch overlaps nothing and
every upload (~1 s an update for 6.7B over PCIe) runs in series with compute. Here each block's forward pre-hook,
put in front of FSDP2's, issues the copies of the blocks after it from pinned memory on a side stream (at most
``ahead_bytes`` of them waiting, and always the next block), makes the compute stream wait for its own copy's
event and points FSDP2's shard sources at that copy; a hook behind FSDP2's points them back at the host shards
and lets the copy go once the compute stream has read it (``record_stream``). FSDP2's own copy then reads a
device tensor (``.to(device)`` returns it) and only casts it. Backward's unshards (resharded after forward) are
not covered: ``--no-reshard-after-forward`` keeps the bf16 weights on the device from forward to backward.
"""
import functools
from typing import Dict, List, Optional

import torch
from shardtrain.core.torch_private import fsdp_shard_sources

AHEAD_BYTES = 2 << 30  # two 6.7B blocks of fp32 shards waiting: 1.6 GB of an 80 GB device


def uploads_ahead(offload, mesh) -> bool:
    """Where FSDP2 copies shards to the device itself on the compute stream: offloaded, a 1-rank shard group
    (the last mesh dimension), an accelerator (a host run has nothing to copy). On more ranks FSDP2 copies
    them on its all-gather streams, which its prefetch already overlaps."""
    from torch.distributed.fsdp import CPUOffloadPolicy  # loaded by then (``offload`` is FSDP2's)
    return isinstance(offload, CPUOffloadPolicy) and mesh.device_type != "cpu" and mesh.size(mesh.ndim - 1) == 1


class DeviceStreams:
    """A side stream of the device, timing events and the current stream, through torch's device module."""

    def __init__(self, device_type: str):
        self.module = torch.get_device_module(device_type)
        self.device = torch.device(device_type, self.module.current_device())
        self.side = self.module.Stream()

    def on_side(self):
        return self.module.stream(self.side)

    def record(self):
        event = self.module.Event(enable_timing=True)
        event.record(self.side)
        return event

    def wait(self, event) -> None:
        self.module.current_stream().wait_event(event)

    def copy(self, shard: torch.Tensor) -> torch.Tensor:
        return shard.to(self.device, non_blocking=True)  # from pinned memory: the host does not wait

    def release(self, copy: torch.Tensor) -> None:
        copy.record_stream(self.module.current_stream())  # not reused before the compute stream has read it

    @staticmethod
    def seconds(start, end) -> float:
        end.synchronize()
        return start.elapsed_time(end) / 1000.0


class UploadAhead:
    """The hooks on ``root`` and each FSDP unit of ``units`` (in forward order) that upload shards ahead."""

    def __init__(self, root: torch.nn.Module, units: List[torch.nn.Module], streams,
                 ahead_bytes: int = AHEAD_BYTES):
        self.streams, self.ahead_bytes = streams, ahead_bytes
        self.sources = [fsdp_shard_sources(unit) for unit in units]
        self.sizes = [sum(s.source.numel() * s.source.element_size() for s in sources) for sources in self.sources]
        self._pending: Dict[int, tuple] = {}  # unit -> (start event, end event, copies)
        self._swapped: Optional[tuple] = None  # (unit, the host shards) while FSDP2's hook runs
        self.timings: List[tuple] = []  # (start, end) events of each upload consumed since the last take
        self._handles = [root.register_forward_pre_hook(self._forward_begins, prepend=True)]
        for i, unit in enumerate(units):
            self._handles.append(unit.register_forward_pre_hook(functools.partial(self._swap_in, i), prepend=True))
            self._handles.append(unit.register_forward_pre_hook(functools.partial(self._swap_out, i)))

    def upload_seconds(self) -> float:
        """Seconds the side stream spent copying the uploads consumed since the last call."""
        taken, self.timings = self.timings, []
        return sum(self.streams.seconds(start, end) for start, end in taken)

    def _forward_begins(self, module, args) -> None:
        self._pending.clear()  # copies a forward did not use (layerdrop) are stale: the shards stepped since

    def _issue(self, i: int) -> None:
        with self.streams.on_side():
            start = self.streams.record()
            copies = [self.streams.copy(s.source) for s in self.sources[i]]
            self._pending[i] = (start, self.streams.record(), copies)

    def _issue_ahead(self, i: int) -> None:
        waiting = sum(self.sizes[j] for j in self._pending if j > i)
        j = max(self._pending, default=i) + 1
        while j < len(self.sources) and (j == i + 1 or waiting + self.sizes[j] <= self.ahead_bytes):
            self._issue(j)
            waiting += self.sizes[j]
            j += 1

    def _swap_in(self, i: int, module, args) -> None:
        for j in [j for j in self._pending if j < i]:  # skipped blocks (layerdrop)
            del self._pending[j]
        if i not in self._pending:
            self._issue(i)
        self._issue_ahead(i)
        start, end, copies = self._pending[i]
        self.streams.wait(end)
        self._swapped = (i, [s.source for s in self.sources[i]])
        for source, copy in zip(self.sources[i], copies):
            source.source = copy

    def _swap_out(self, i: int, module, args) -> None:
        if self._swapped is None or self._swapped[0] != i:
            return
        start, end, copies = self._pending.pop(i)
        for source, host in zip(self.sources[i], self._swapped[1]):
            source.source = host
        for copy in copies:
            self.streams.release(copy)
        self._swapped = None
        self.timings.append((start, end))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
