"""Every private torch API shardtrain calls, each behind one small function.

torch may rename or change a private API in any release. Kept here, a change
fails ``tests/core/test_torch_private.py`` with the name of what moved, rather
than a checkpoint command far away. Tested with the torch range in setup.py.
"""
import os
from typing import Any, Dict, Iterable

import torch


def _moved(what: str, used_for: str) -> RuntimeError:
    return RuntimeError(f"torch {torch.__version__} no longer provides {what}, which shardtrain uses {used_for}. "
                        "Install the torch version setup.py names, or update shardtrain/core/torch_private.py.")


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
