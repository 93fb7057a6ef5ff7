"""--cpu-offload on one rank: the next blocks' shards are copied to the device ahead, on a side stream
(trainer/parallel/upload_ahead.py). In process, on a real 1-rank FSDP2 (gloo, CPU); a stand-in for the device's
streams records each copy as it is issued and returns a copy of different values, so the blocks' forwards show
that FSDP2 computed with the copy uploaded ahead. The GPU run (real streams, pinned memory) is the GPU case's."""
import contextlib
import types

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

from shardtrain.trainer.parallel.fsdp_wrap import apply_fsdp
from shardtrain.trainer.parallel.upload_ahead import UploadAhead, uploads_ahead

BLOCKS = 4
BLOCK_BYTES = (8 * 8 + 8) * 4  # one Linear(8, 8)'s fp32 weight and bias


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(BLOCKS))
        with torch.no_grad():
            for i, block in enumerate(self.blocks):  # block i's weights all i + 1, its bias 0
                block.weight.fill_(i + 1.0)
                block.bias.zero_()

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class RecordingStreams:
    """The device's streams for a host run: ("copy", block) when a block's copy is issued, ("wait", block) when
    the compute stream is made to wait for it, ("release", block) when it is let go. Each copy holds twice the
    host shard's values."""

    def __init__(self, model, events):
        self.events = events
        self.block_of = {p.to_local().data_ptr(): i for i, b in enumerate(model.blocks) for p in b.parameters()}
        self._copied = {}  # id of a copy -> its block
        self._last = None

    def on_side(self):
        return contextlib.nullcontext()

    def record(self):
        return types.SimpleNamespace(block=self._last)  # the end event names the block just copied

    def wait(self, event):
        self.events.append(("wait", event.block))

    def copy(self, shard):
        self._last = self.block_of[shard.data_ptr()]
        self.events.append(("copy", self._last))
        copy = shard * 2
        self._copied[id(copy)] = self._last
        return copy

    def release(self, copy):
        self.events.append(("release", self._copied.pop(id(copy))))

    @staticmethod
    def seconds(start, end):
        return 0.25  # each upload, as its events would time it


def _wrapped(mesh):
    model = Blocks()
    apply_fsdp(model, mesh, MixedPrecisionPolicy(), reshard_after_forward=True,
               offload=CPUOffloadPolicy(pin_memory=False), min_params_to_wrap=0)
    return model


def _run(mesh, ahead_bytes):
    """(events, the weights each block computed with) of one forward and backward."""
    model = _wrapped(mesh)
    events, seen = [], {}
    upload = UploadAhead(model, list(model.blocks), RecordingStreams(model, events), ahead_bytes=ahead_bytes)
    for i, block in enumerate(model.blocks):  # inside FSDP2's hooks: the weight is the unsharded one
        def computed(x, _i=i, _block=block, _forward=block.forward):
            out = _forward(x)
            seen[_i] = _block.weight.detach().clone()
            events.append(("compute_end", _i))
            return out
        block.forward = computed
    model(torch.ones(2, 8)).sum().backward()
    upload.close()
    return model, events, seen, upload


def test_the_next_blocks_copy_is_issued_before_this_blocks_compute_ends(one_rank_group):
    model, events, seen, upload = _run(one_rank_group, ahead_bytes=BLOCK_BYTES)
    at = {e: n for n, e in enumerate(events)}
    for k in range(BLOCKS - 1):
        assert at[("copy", k + 1)] < at[("compute_end", k)], events
        assert at[("wait", k)] < at[("compute_end", k)]
        assert at[("release", k)] < at[("compute_end", k)]  # after FSDP2's hook queued its read of the copy
    for k in range(BLOCKS - 2):  # bounded: one block waiting ahead, so k + 2's copy only once k + 1 starts
        assert at[("copy", k + 2)] > at[("compute_end", k)], events
    assert [e for e in events if e[0] == "copy"] == [("copy", k) for k in range(BLOCKS) for _ in range(2)]
    # FSDP2 computed with the copies (twice block i's i + 1), and the host shards are the host's again
    for i, block in enumerate(model.blocks):
        assert torch.equal(seen[i], torch.full((8, 8), 2.0 * (i + 1))), i
        assert torch.equal(block.weight.to_local(), torch.full((8, 8), i + 1.0))
        assert block.weight.grad is not None
    assert upload.upload_seconds() == 4 * 0.25 and upload.upload_seconds() == 0.0  # each forward's, once


def test_the_next_forward_uploads_the_host_shards_as_they_are_then(one_rank_group):
    """After an optimizer step in host memory, the next forward computes with the stepped shards (twice them)."""
    model = _wrapped(one_rank_group)
    events, seen = [], {}
    upload = UploadAhead(model, list(model.blocks), RecordingStreams(model, events), ahead_bytes=BLOCK_BYTES)
    block, forward = model.blocks[2], model.blocks[2].forward

    def computed(x):  # inside FSDP2's hooks: the weight is the unsharded one
        seen[len(seen)] = block.weight.detach().clone()
        return forward(x)

    block.forward = computed
    model(torch.ones(1, 8))
    with torch.no_grad():
        block.weight.to_local().add_(0.5)  # the CPU step: block 2's weights 3 -> 3.5
    model(torch.ones(1, 8))
    upload.close()
    assert torch.equal(seen[0], torch.full((8, 8), 6.0)) and torch.equal(seen[1], torch.full((8, 8), 7.0))


def test_more_room_uploads_further_ahead(one_rank_group):
    _, events, _, _ = _run(one_rank_group, ahead_bytes=3 * BLOCK_BYTES)
    first_compute = events.index(("compute_end", 0))
    issued = [e[1] for e in events[:first_compute] if e[0] == "copy"]
    assert issued == [0, 0, 1, 1, 2, 2, 3, 3]  # weight and bias of block 0, and of the three blocks ahead


class _Mesh:
    def __init__(self, device_type, shape):
        self.device_type, self.shape, self.ndim = device_type, shape, len(shape)

    def size(self, dim):
        return self.shape[dim]


@pytest.mark.parametrize("offload, device_type, shape, expected", [
    (CPUOffloadPolicy(), "cuda", (1,), True),
    (CPUOffloadPolicy(), "cuda", (4, 1), True),  # replicated across 4, each shard group one rank
    (CPUOffloadPolicy(), "cuda", (2,), False),  # FSDP2 copies on its all-gather streams, which prefetch
    (CPUOffloadPolicy(), "cuda", (1, 2), False),
    (CPUOffloadPolicy(), "cpu", (1,), False),  # nothing travels
    (OffloadPolicy(), "cuda", (1,), False),  # the shards are on the device already
])
def test_uploads_ahead_only_where_fsdp2_copies_on_the_compute_stream(offload, device_type, shape, expected):
    assert uploads_ahead(offload, _Mesh(device_type, shape)) is expected


def test_apply_fsdp_uploads_ahead_where_it_applies(one_rank_group, monkeypatch):
    """The wrapping puts the hooks on (uploads_ahead's decision forced: a host mesh never needs them)."""
    import shardtrain.trainer.parallel.fsdp_wrap as fsdp_wrap
    made = []

    class Streams(RecordingStreams):
        def __init__(self, device_type):
            made.append(device_type)
            self.events, self._copied, self._last, self.block_of = [], {}, None, {}

        def copy(self, shard):
            self.events.append(("copy", None))
            return shard * 2

        def release(self, copy):
            self.events.append(("release", None))

    monkeypatch.setattr(fsdp_wrap, "uploads_ahead", lambda offload, mesh: True)
    monkeypatch.setattr(fsdp_wrap, "DeviceStreams", Streams)
    model = _wrapped(one_rank_group)
    out = model(torch.ones(1, 8))
    # computed with the doubled copies: block i takes a vector of equal entries v to 8 x 2(i + 1) x v,
    # 1 -> 16 -> 512 -> 24,576 -> 1,572,864 (with the host's weights: 1 -> 8 -> 128 -> 3,072 -> 98,304)
    assert made == ["cpu"] and torch.equal(out, torch.full((1, 8), 1572864.0))
