"""Everything in shardtrain that depends on torch's version or on its private internals,
each behind one small function.

torch may rename or change a private API in any release, and public ones differ
across the supported range (pyproject.toml: 2.11 through 2.15). Kept here, a
change fails ``tests/core/test_torch_private.py`` with the name of what moved,
rather than a checkpoint command far away; each version shim is tested on both
of its branches (the running torch's for real, the other through a stand-in).
"""
import contextlib
import inspect
import os
from typing import Any, Dict, Iterable, List

import torch


def _moved(what: str, used_for: str) -> RuntimeError:
    return RuntimeError(f"torch {torch.__version__} no longer provides {what}, which shardtrain uses {used_for}. "
                        "Install a torch in the range pyproject.toml names, or update "
                        "shardtrain/core/torch_private.py.")


def load_dcp_keys(keys: Iterable[str], storage_reader) -> Dict[str, Any]:
    """The named top-level keys of a DCP checkpoint, read whole into this process.

    Why private: DCP's public ``dcp.load`` fills tensors the caller allocated
    (which needs the model), and ``format_utils.dcp_to_torch_save`` reads
    through its own reader (not the allow-listing one) and writes a file."""
    try:
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys
    except ImportError:
        raise _moved("torch.distributed.checkpoint.state_dict_loader._load_state_dict_from_keys",
                     "to consolidate a sharded checkpoint") from None
    return _load_state_dict_from_keys(set(keys), storage_reader=storage_reader)


def dcp_metadata_path(reader) -> str:
    """Where a ``FileSystemReader``'s checkpoint keeps its ``.metadata`` file.

    Why private: the safe reader unpickles the metadata itself (with an
    allow-list) and torch has no public way to name the file."""
    if not hasattr(reader, "_get_metadata_path"):
        raise _moved("FileSystemReader._get_metadata_path", "to read sharded checkpoint metadata safely")
    return os.fspath(reader._get_metadata_path())


def use_file_system(writer, file_system) -> None:
    """Make a DCP ``FileSystemWriter`` open its files through ``file_system``.

    Why private: the writer's ``fs`` attribute is undocumented, and DCP has no public hook that sees the
    bytes as they are written (checksums.py hashes them there, so nothing is read back)."""
    if not hasattr(writer, "fs"):
        raise _moved("FileSystemWriter.fs", "to checksum the shard files as they are written")
    writer.fs = file_system


def memory_tracker(model, optimizer, fsdp: bool):
    """torch's tracker of live tensor memory by kind (parameters, gradients, activations, optimizer
    state, temporaries; for FSDP2 also sharded vs gathered, all-gather and reduce-scatter buffers),
    with ``model`` and ``optimizer`` registered. Use as a context manager around the steps; read
    ``get_tracker_snapshot("peak")``.

    Why private: ``torch.distributed._tools`` is torch's own memory planner for FSDP2 (used by
    its auto-parallel work) and has no public home yet. shard-plan runs it on fake tensors."""
    try:
        if fsdp:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
            return FSDPMemTracker(model, optimizer)
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:
        raise _moved("torch.distributed._tools' memory trackers", "to plan memory (shard-plan)") from None
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    return tracker


def reset_tracker_peak(tracker) -> None:
    """Make the peak of a ``memory_tracker`` (entered) what is live now: a later ``get_tracker_snapshot("peak")``
    holds only what came after. shard-plan keeps a step's second update: the first also sets up what the second
    reuses (on FSDP2's shards of fake tensors, its optimizer step held ten times the parameters' bytes as
    optimizer state at once, measured with torch 2.13; the second step of the same shapes, two).

    Why private: torch's trackers reset their peak only when entered (``MemTracker.__enter__``), and leaving and
    entering again would drop the hooks that tell parameters, gradients and optimizer state apart."""
    try:
        from torch.distributed._tools.mem_tracker import _TOTAL_KEY
    except ImportError:
        raise _moved("torch.distributed._tools.mem_tracker._TOTAL_KEY", "to plan memory (shard-plan)") from None
    if not (hasattr(tracker, "_peak_mem") and hasattr(tracker, "_peak_mem_snap")):
        raise _moved("MemTracker._peak_mem and _peak_mem_snap", "to plan memory (shard-plan)")
    tracker._peak_mem_snap = tracker.get_tracker_snapshot()
    tracker._peak_mem = {dev: snap[_TOTAL_KEY] for dev, snap in tracker._peak_mem_snap.items()}


@contextlib.contextmanager
def sharding_propagation_untracked(tracker):
    """While entered (inside an entered ``memory_tracker``), the tensors DTensor's sharding propagation makes to
    work out an op's output shapes are not tracked: full-size fake tensors, freed at once, that a real run never
    allocates. torch propagates an op afresh until its result is cached, and torch 2.11 does so for FSDP2's fused
    Adam step at every step (2.13 caches it after the first): its tracker counted them as optimizer state, ten
    times the parameters' shard, and the hybrid plan came out 65% high on the CI's torch 2.11 run.

    Why private: ``ShardingPropagator._propagate_tensor_meta_non_cached`` is where DTensor makes them, and
    ``_track`` is the trackers' per-tensor hook; neither has a public switch."""
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:
        raise _moved("torch.distributed.tensor._sharding_prop.ShardingPropagator",
                     "to plan memory (shard-plan)") from None
    name = "_propagate_tensor_meta_non_cached"
    if name not in ShardingPropagator.__dict__ or not hasattr(tracker, "_track"):
        raise _moved(f"ShardingPropagator.{name} or the memory trackers' _track", "to plan memory (shard-plan)")
    propagate, track, depth = ShardingPropagator.__dict__[name], tracker._track, [0]

    def propagating(self, *args, **kwargs):
        depth[0] += 1
        try:
            return propagate(self, *args, **kwargs)
        finally:
            depth[0] -= 1

    def untracked_while_propagating(*args, **kwargs):
        if not depth[0]:
            track(*args, **kwargs)

    setattr(ShardingPropagator, name, propagating)
    tracker._track = untracked_while_propagating
    try:
        yield
    finally:
        setattr(ShardingPropagator, name, propagate)
        del tracker._track  # the class's own again


def end_process_group() -> None:
    """``destroy_process_group``, and DTensor's sharding caches emptied with it, so that a later run in this
    process (the Python API, a notebook, the test suite) cannot meet the ended run's device meshes.

    Why: a DeviceMesh compares equal by its layout, device type and dimension names, not by its process groups.
    DTensor caches each op's output sharding, mesh included, so a later run's equal mesh is answered with the old
    mesh object, which names the old run's groups; where the new run's groups are named otherwise, its first
    collective on such a tensor fails ("Could not resolve the process group registered under the name 1": a
    fully_sharded resume after a run that had one group more). Why private: torch offers no public way to empty
    those caches; ``debug._clear_sharding_prop_cache`` is what torch's own tests call."""
    import sys

    import torch.distributed as dist
    dist.destroy_process_group()
    if "torch.distributed.tensor" not in sys.modules:  # no DTensor was ever made here: nothing is cached
        return
    try:
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    except ImportError:
        raise _moved("torch.distributed.tensor.debug._clear_sharding_prop_cache",
                     "to forget an ended run's device meshes") from None
    _clear_sharding_prop_cache()


def init_fake_process_group(world_size: int, rank: int = 0) -> None:
    """This process as ``rank`` of ``world_size`` on torch's fake process group: collectives return
    at once with outputs of the right shapes, so FSDP2 can be set up for any world size here.

    Why private: the fake backend and its store live in torch.testing._internal (torch's own tests and
    its memory tools use them); there is no public equivalent."""
    import torch.distributed as dist
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError:
        raise _moved("torch.testing._internal.distributed.fake_pg", "to plan memory (shard-plan)") from None
    dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())


def fake_tensor_mode():
    """A mode in which new tensors are fake: shapes, dtypes and devices, no memory, no values (real
    tensors are accepted as inputs). shard-plan runs a training step in it.

    Why private: FakeTensorMode lives in torch._subclasses; torch's compiler and memory tools use it, and
    it has no public home."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
    except ImportError:
        raise _moved("torch._subclasses.fake_tensor.FakeTensorMode", "to plan memory (shard-plan)") from None
    return FakeTensorMode(allow_non_fake_inputs=True)


def outside_fake_tensor_mode():
    """Inside ``fake_tensor_mode``: a context in which tensors are real again (a model built on the meta
    device there, so that its parameters are ordinary meta tensors a backend can wrap)."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:
        raise _moved("torch._subclasses.fake_tensor.unset_fake_temporarily", "to plan memory (shard-plan)") from None
    return unset_fake_temporarily()


def dtensor_around(like, local: torch.Tensor):
    """A DTensor laid out as ``like`` (same mesh, placements, global shape) whose local shard is ``local``,
    which stays where it is (a host copy of an accelerator shard, for an async save).

    Why private: the public ``DTensor.from_local`` moves the shard to the mesh's device, and the
    constructor that does not takes the private ``_spec``."""
    from torch.distributed.tensor import DTensor
    if not hasattr(like, "_spec"):
        raise _moved("DTensor._spec", "to stage an accelerator shard in host memory for --async-save")
    return DTensor(local, like._spec, requires_grad=False)


def dtensor_where_it_is(local: torch.Tensor, mesh, placements, shape) -> "torch.Tensor":
    """``DTensor.from_local(local, mesh, placements, shape=shape, stride=contiguous)``, except that
    ``local`` stays on its own device: an optimizer's host-memory state under --cpu-offload, whose
    mesh is the GPU's (FSDP2 keeps its offloaded parameter and gradient shards the same way).

    Why private: the public ``DTensor.from_local`` moves the shard to the mesh's device (the first
    GPU run failed so: adafactor's factored statistics landed on cuda:0 beside CPU gradients), and
    the constructor that does not takes a ``DTensorSpec``, whose module is private."""
    from torch.distributed.tensor import DTensor
    try:
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    except ImportError:
        raise _moved("torch.distributed.tensor._dtensor_spec.DTensorSpec",
                     "to keep sharded optimizer state in host memory under --cpu-offload") from None
    shape = torch.Size(shape)
    meta = TensorMeta(shape, torch.empty(shape, device="meta").stride(), local.dtype)
    return DTensor(local, DTensorSpec(mesh, tuple(placements), tensor_meta=meta), requires_grad=False)


def total_norm_of_shards(local_norms: List[torch.Tensor], like) -> torch.Tensor:
    """The 2-norm of a sharded gradient from ``local_norms``, this rank's 2-norm of its shard of each tensor,
    taken exactly as ``torch.nn.utils.get_total_norm`` takes it over DTensors laid out as ``like`` and
    ``full_tensor`` makes it whole: each local norm wrapped as a partial norm, stacked, normed, reduced (how
    DTensor propagates the partial placements through ``stack`` and ``vector_norm`` decides the bits, so
    they go through DTensor rather than a copy of its recipe).

    Why private: the partial-norm placement (``_NormPartial``) is private. Used by the CPU step during
    backward, whose worker takes each shard's norm before stepping it (trainer/parallel/step_in_backward.py)."""
    try:
        from torch.distributed.tensor import DTensor, Replicate
        from torch.distributed.tensor._ops._math_ops import _NormPartial
    except ImportError:
        raise _moved("torch.distributed.tensor._ops._math_ops._NormPartial",
                     "to take the gradient norm from per-shard norms during backward") from None
    placements = [_NormPartial(2.0) if p.is_shard() else Replicate() for p in like.placements]
    partials = [dtensor_where_it_is(n, like.device_mesh, placements, n.shape) for n in local_norms]
    total = torch.linalg.vector_norm(torch.stack(partials), 2.0)
    return total.full_tensor() if isinstance(total, DTensor) else total


def ddp_without_forward_buffer_sync(module, ddp_class=None, **kwargs):
    """``DistributedDataParallel(module, **kwargs)`` that broadcasts rank 0's buffers once, when it is
    built (as it does the parameters), and never again before a forward. shardtrain's models have no
    buffers that training changes, so a broadcast per forward would be a collective per micro-batch
    for nothing. ``ddp_class`` is for the tests' stand-ins.

    Why version-dependent: torch 2.13 added ``forward_sync_buffers``; ``False`` stops the per-forward
    broadcast and keeps the one at construction. Before it (2.11; DDP's signature decides, not a
    version number) there is only ``broadcast_buffers``, and ``False`` there skips the construction
    broadcast too (2.13's deprecation warning for it says so): ranks would keep the buffers they
    built. There: build with its default (``True``: both broadcasts), then clear the
    ``broadcast_buffers`` attribute, which every later sync reads (``will_sync_module_buffers``,
    join's final sync); only DDP's usage log, written at construction, still records ``True``."""
    if ddp_class is None:
        from torch.nn.parallel import DistributedDataParallel as ddp_class
    if "forward_sync_buffers" in inspect.signature(ddp_class).parameters:
        return ddp_class(module, forward_sync_buffers=False, **kwargs)
    ddp = ddp_class(module, **kwargs)
    ddp.broadcast_buffers = False
    return ddp


class ShardSource:
    """Where FSDP2 reads one parameter's local shard from when it unshards it (``source``: get or set). Set to a
    device copy of the same shape and dtype, FSDP2's copy of an offloaded shard to the device reads that instead."""

    def __init__(self, fsdp_param):
        self._param = fsdp_param

    @property
    def source(self) -> torch.Tensor:
        return self._param._sharded_param_data

    @source.setter
    def source(self, tensor: torch.Tensor) -> None:
        self._param._sharded_param_data = tensor


def fsdp_shard_sources(module) -> List[ShardSource]:
    """The shard sources of the parameters ``fully_shard(module)`` manages (none for a module it does not).

    Why private: on a 1-rank shard group FSDP2 copies an offloaded shard to the device on the compute stream
    when the block needs it (``FSDPParamGroup.wait_for_unshard``: ``FSDPParam.all_gather_inputs`` reads
    ``_sharded_param_data`` and calls ``.to(device, non_blocking=True)``), so its prefetch overlaps nothing; there
    is no public way to hand it a copy made ahead on a side stream (trainer/parallel/upload_ahead.py does)."""
    if not hasattr(module, "_get_fsdp_state"):
        return []
    group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
    if group is None:
        return []
    params = getattr(group, "fsdp_params", None)
    if params is None or not all(hasattr(p, "_sharded_param_data") for p in params):
        raise _moved("FSDPParamGroup.fsdp_params' _sharded_param_data", "to upload offloaded shards ahead")
    return [ShardSource(p) for p in params]
