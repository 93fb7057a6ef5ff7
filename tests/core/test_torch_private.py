"""The private torch APIs shardtrain calls (shardtrain/core/torch_private.py) still do what it relies on.

When a torch upgrade moves one, these fail here, naming it."""
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from shardtrain.core import torch_private
from shardtrain.trainer.checkpoint.safe_loading import SafeFileSystemReader


@pytest.fixture
def checkpoint(tmp_path):
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "optimizer": {"state": {"w": torch.ones(2)}},
             "other": torch.zeros(4)}
    dcp.save(state, checkpoint_id=str(tmp_path), no_dist=True)
    return str(tmp_path)


def test_named_keys_load_whole_and_only_those(checkpoint):
    loaded = torch_private.load_dcp_keys(["model", "optimizer"], storage_reader=SafeFileSystemReader(checkpoint))
    assert sorted(loaded) == ["model", "optimizer"]
    assert torch.equal(loaded["model"]["w"], torch.arange(6.0).reshape(2, 3))
    assert torch.equal(loaded["optimizer"]["state"]["w"], torch.ones(2))


def test_the_metadata_file_is_found(checkpoint):
    path = torch_private.dcp_metadata_path(FileSystemReader(checkpoint))
    assert os.path.isfile(path) and os.path.dirname(path) == checkpoint


def test_a_moved_private_api_is_named(monkeypatch, checkpoint):
    monkeypatch.delattr(FileSystemReader, "_get_metadata_path")
    with pytest.raises(RuntimeError, match="no longer provides FileSystemReader._get_metadata_path"):
        torch_private.dcp_metadata_path(FileSystemReader(checkpoint))
    import torch.distributed.checkpoint.state_dict_loader as loader
    monkeypatch.delattr(loader, "_load_state_dict_from_keys")
    with pytest.raises(RuntimeError, match="no longer provides .*_load_state_dict_from_keys"):
        torch_private.load_dcp_keys(["model"], storage_reader=FileSystemReader(checkpoint))


def test_a_writer_writes_through_the_file_system_it_is_given(tmp_path, monkeypatch):
    """The shard files' checksums are taken as DCP writes them: every file it writes, with its real bytes
    (several blocks, the buffer's tail that DCP's fsync would miss, too)."""
    from torch.distributed.checkpoint import FileSystemWriter

    from shardtrain.trainer.checkpoint import checksums
    from shardtrain.trainer.checkpoint.checksums import HashingFileSystem, file_entry

    monkeypatch.setattr(checksums, "BLOCK", 4096)
    writer, hashing = FileSystemWriter(str(tmp_path)), HashingFileSystem()
    torch_private.use_file_system(writer, hashing)
    dcp.save({"big": torch.randn(5000), "small": torch.arange(5)}, storage_writer=writer, no_dist=True)
    assert set(hashing.written) == {p.name for p in tmp_path.iterdir()} == {"__0_0.distcp", ".metadata"}
    for name, entry in hashing.written.items():
        assert entry == file_entry(str(tmp_path / name))
    assert len(hashing.written["__0_0.distcp"]["crc32"]) > 4
    with pytest.raises(RuntimeError, match="no longer provides FileSystemWriter.fs"):
        torch_private.use_file_system(object(), hashing)


def test_the_memory_tracker_sees_fake_tensors_by_kind():
    """shard-plan's tracer: parameters, gradients and optimizer state of a step on fake tensors, by kind."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        model = torch.nn.Linear(256, 128, bias=False)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cpu")
        optimizer = torch.optim.AdamW(model.parameters(), fused=True)
        tracker = torch_private.memory_tracker(model, optimizer, fsdp=False)
        with tracker:
            for update in range(2):
                model(torch.randn(4, 256)).sum().backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if update == 0:
                    tracker.reset_mod_stats()
        peak = {k.value: v for k, v in tracker.get_tracker_snapshot("peak")[torch.device("cpu")].items()
                if k != "Total"}
    weight = 256 * 128 * 4
    assert peak["Parameter"] == weight and peak["Optstate"] >= 2 * weight


def test_a_fake_process_group_of_any_size():
    import torch.distributed as dist

    torch_private.init_fake_process_group(8, rank=5)
    try:
        assert (dist.get_world_size(), dist.get_rank()) == (8, 5)
        t = torch.ones(3)
        dist.all_reduce(t)  # returns at once; the fake group computes nothing
    finally:
        dist.destroy_process_group()


def test_moved_memory_tools_are_named(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "torch.distributed._tools.mem_tracker", None)
    with pytest.raises(RuntimeError, match="no longer provides torch.distributed._tools"):
        torch_private.memory_tracker(torch.nn.Linear(2, 2), None, fsdp=False)
    monkeypatch.setitem(sys.modules, "torch.testing._internal.distributed.fake_pg", None)
    with pytest.raises(RuntimeError, match="no longer provides torch.testing._internal.distributed.fake_pg"):
        torch_private.init_fake_process_group(2)
