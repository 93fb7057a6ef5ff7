"""The private torch APIs shardtrain calls (shardtrain/core/torch_private.py) still do what it relies on,
and each shim over a difference between torch versions does the same on both of its branches.

When a torch upgrade moves one, these fail here, naming it."""
import contextlib
import inspect
import os
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader

from st_testutils import spawn_ranks
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


def test_a_trackers_peak_starts_again_from_what_is_live():
    tracker = torch_private.memory_tracker(torch.nn.Linear(2, 2), None, fsdp=False)
    cpu = torch.device("cpu")
    with tracker:
        big = torch.ones(2 ** 20)  # 4 MiB, freed before the reset
        del big
        torch_private.reset_tracker_peak(tracker)
        small = torch.ones(1024)
        assert tracker.get_tracker_snapshot("peak")[cpu]["Total"] < 2 ** 20
        del small
    with pytest.raises(RuntimeError, match="no longer provides MemTracker._peak_mem"):
        torch_private.reset_tracker_peak(object())


def _first_fsdp_adam_step_optimizer_peak(untracked: bool) -> int:
    """Optimizer-state bytes at the peak of the first fused Adam step on FSDP2's shards of a fresh shape (its
    sharding not yet propagated in this process), on 2 fake ranks; ``untracked``: the propagation's tensors not
    tracked. The shapes differ between the two calls, so each propagates afresh."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    torch_private.init_fake_process_group(2)
    try:
        with torch.device("meta"):
            model = torch.nn.Sequential(torch.nn.Linear(304 + untracked, 96, bias=False))
        fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
        with torch_private.fake_tensor_mode():
            model.to_empty(device="cpu")
            optimizer = torch.optim.Adam(model.parameters(), fused=True)
            tracker = torch_private.memory_tracker(model, optimizer, fsdp=True)
            with tracker, (torch_private.sharding_propagation_untracked(tracker) if untracked
                           else contextlib.nullcontext()):
                model(torch.randn(4, 304 + untracked)).sum().backward()
                torch_private.reset_tracker_peak(tracker)  # the step's own peak
                optimizer.step()
            peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
        return sum(v for k, v in peak.items() if "OPT" in str(k).upper())
    finally:
        dist.destroy_process_group()


def test_dtensors_shape_propagation_is_not_counted_as_optimizer_state():
    """The first step of a shape propagates its shardings afresh (torch 2.11 did so at every step): the full-size
    fake tensors that makes are not memory a run holds. A rank's shard of the weight: 305 x 96 / 2 fp32 values,
    and Adam's two moments of it (the step counters a few bytes more)."""
    shard = 305 * 96 // 2 * 4
    untracked = _first_fsdp_adam_step_optimizer_peak(untracked=True)
    assert 2 * shard <= untracked < 2 * shard + 1024
    assert _first_fsdp_adam_step_optimizer_peak(untracked=False) > 4 * shard  # counted: the full weight, and more
    with pytest.raises(RuntimeError, match="no longer provides ShardingPropagator"):
        with torch_private.sharding_propagation_untracked(object()):
            pass


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


def test_fake_tensors_hold_no_memory_and_real_ones_come_back_inside():
    with torch_private.fake_tensor_mode():
        fake = torch.ones(1000, 1000)
        with torch_private.outside_fake_tensor_mode():
            real = torch.ones(2)
    assert type(fake).__name__ == "FakeTensor" and fake.shape == (1000, 1000)
    assert type(real) is torch.Tensor and real.tolist() == [1.0, 1.0]


def test_moved_fake_tensors_are_named(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "torch._subclasses.fake_tensor", None)
    with pytest.raises(RuntimeError, match="no longer provides torch._subclasses.fake_tensor.FakeTensorMode"):
        torch_private.fake_tensor_mode()
    with pytest.raises(RuntimeError, match="no longer provides torch._subclasses.fake_tensor.unset_fake"):
        torch_private.outside_fake_tensor_mode()


def test_a_dtensor_keeps_its_shard_where_it_is_and_a_moved_spec_is_named(tmp_path, monkeypatch):
    import sys
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        monkeypatch.setattr(type(mesh), "device_type", property(lambda self: "meta"))  # a GPU mesh, say
        local = torch.arange(6.0).reshape(3, 2)
        dt = torch_private.dtensor_where_it_is(local, mesh, [Shard(0)], (3, 2))
        assert dt.to_local().data_ptr() == local.data_ptr() and dt.device_mesh is mesh and dt.placements == (Shard(0),)
        assert dt.shape == (3, 2) and dt.stride() == (2, 1) and dt.dtype == torch.float32
        assert torch_private.dtensor_where_it_is(torch.zeros(5), mesh, [Replicate()], (5,)).to_local().device.type \
            == "cpu"
        monkeypatch.setitem(sys.modules, "torch.distributed.tensor._dtensor_spec", None)
        with pytest.raises(RuntimeError, match="no longer provides torch.distributed.tensor._dtensor_spec"):
            torch_private.dtensor_where_it_is(local, mesh, [Shard(0)], (3, 2))
    finally:
        dist.destroy_process_group()


class _Buffered(torch.nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.register_buffer("b", torch.full((2,), value))

    def forward(self, x):
        return self.lin(x) + self.b


class _DDPWithoutForwardSyncArgument(torch.nn.parallel.DistributedDataParallel):
    """torch's DDP behind a signature without ``forward_sync_buffers`` (as before 2.13, which raised
    TypeError on it): the shim's other branch, run for real where the running torch has the argument."""

    def __init__(self, module, device_ids=None, broadcast_buffers=True, bucket_cap_mb=None,
                 find_unused_parameters=False):
        with warnings.catch_warnings():  # torch 2.13 deprecates broadcast_buffers; 2.11 knew nothing else
            warnings.simplefilter("ignore", FutureWarning)
            super().__init__(module, device_ids=device_ids, broadcast_buffers=broadcast_buffers,
                             bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters)


def _pytorch_ddp_backend():
    from types import SimpleNamespace

    from shardtrain.trainer.parallel.ddp import DDPBackend
    flags = SimpleNamespace(bucket_cap_mb=25, find_unused_parameters=False, gradient_as_bucket_view=False)
    return DDPBackend(SimpleNamespace(device=torch.device("cpu")), flags)


def _buffer_rank(rank, root):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{root}/rdzv", rank=rank, world_size=2)
    try:
        variants = {"torch's DDP": lambda m: torch_private.ddp_without_forward_buffer_sync(m),
                    "stand-in": lambda m: torch_private.ddp_without_forward_buffer_sync(
                        m, _DDPWithoutForwardSyncArgument),
                    "--ddp-backend pytorch_ddp": _pytorch_ddp_backend().wrap,
                    "control: torch's default": torch.nn.parallel.DistributedDataParallel}
        seen = {}
        for name, wrap in variants.items():
            ddp = wrap(_Buffered(float(rank)))
            built = ddp.module.b[0].item()
            ddp.module.b.fill_(10.0 + rank)
            ddp(torch.ones(1, 2))
            seen[name] = (built, ddp.module.b[0].item())
        torch.save(seen, os.path.join(root, f"rank{rank}.pt"))
        dist.barrier()  # both ranks past their last collective before either tears gloo down
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_broadcasts_buffers_when_built_and_never_in_forward(tmp_path):
    """Where torch has ``forward_sync_buffers`` (2.13+) both branches of the shim run here for real;
    on 2.11 the stand-in takes the same branch as torch's DDP (the next test covers the other)."""
    spawn_ranks(_buffer_rank, (str(tmp_path),))
    assert "forward_sync_buffers" not in inspect.signature(_DDPWithoutForwardSyncArgument).parameters
    seen = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    # (buffer after wrapping, after a forward) on rank 0, rank 1: rank 0's at construction, then each rank's own
    for name in ("torch's DDP", "stand-in", "--ddp-backend pytorch_ddp"):
        assert [seen[0][name], seen[1][name]] == [(0.0, 10.0), (0.0, 11.0)], name
    assert [seen[0]["control: torch's default"], seen[1]["control: torch's default"]] == [(0.0, 10.0), (0.0, 10.0)]


class _Recording:
    """DDP's signature before 2.13; records what it was built with."""

    def __init__(self, module, device_ids=None, broadcast_buffers=True):
        self.module, self.broadcast_buffers = module, broadcast_buffers
        self.built_with = {"device_ids": device_ids, "broadcast_buffers": broadcast_buffers}


class _RecordingWithArgument(_Recording):
    """DDP's signature from 2.13 on."""

    def __init__(self, module, device_ids=None, broadcast_buffers=None, forward_sync_buffers=None):
        super().__init__(module, device_ids, broadcast_buffers)
        self.built_with["forward_sync_buffers"] = forward_sync_buffers


def test_ddp_shim_takes_the_branch_the_signature_allows():
    """Both branches on any torch, through recording stand-ins: with the argument (2.13+) it is passed
    as False and nothing else changes; without it (2.11, 2.12) the construction keeps its default
    broadcast and the attribute every later sync reads is cleared."""
    module = torch.nn.Linear(2, 2)
    new = torch_private.ddp_without_forward_buffer_sync(module, _RecordingWithArgument, device_ids=[3])
    assert new.built_with == {"device_ids": [3], "broadcast_buffers": None, "forward_sync_buffers": False}
    assert new.broadcast_buffers is None and new.module is module
    old = torch_private.ddp_without_forward_buffer_sync(module, _Recording, device_ids=[3])
    assert old.built_with == {"device_ids": [3], "broadcast_buffers": True} and old.module is module
    assert old.broadcast_buffers is False


def test_the_norm_of_shards_is_get_total_norms_and_a_moved_partial_norm_is_named(one_rank_group, monkeypatch):
    """On one rank the reduction is trivial: what this pins is the wrapping (a norm per tensor, stacked, normed,
    made whole) against torch's own over DTensors; two ranks' bits: tests/trainer/parallel/
    test_step_in_backward.py's equality test."""
    import sys
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = one_rank_group
    g = torch.Generator().manual_seed(0)
    grads = [distribute_tensor(torch.randn(n, generator=g) * 0.01, mesh, [Shard(0)]) for n in (37, 1000, 5, 3)]
    expected = torch.nn.utils.get_total_norm(grads, foreach=True).full_tensor()
    local = [torch.linalg.vector_norm(d.to_local(), 2.0) for d in grads]
    got = torch_private.total_norm_of_shards(local, grads[0])
    assert got.device.type == "cpu" and torch.equal(got, expected)
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor._ops._math_ops", None)
    with pytest.raises(RuntimeError, match="no longer provides torch.distributed.tensor._ops._math_ops._NormPartial"):
        torch_private.total_norm_of_shards(local, grads[0])


def test_fsdp2_unshards_a_1_rank_shard_from_the_source_it_is_given(one_rank_group):
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    linear = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    fully_shard(linear, mesh=one_rank_group, offload_policy=CPUOffloadPolicy(pin_memory=False))
    assert torch_private.fsdp_shard_sources(torch.nn.Linear(2, 2)) == []  # not an FSDP module
    linear(torch.zeros(1, 2))  # FSDP2's lazy init (the first forward) may replace the source: swaps come after
    linear.reshard()  # a root stays unsharded after forward
    (source,) = torch_private.fsdp_shard_sources(linear)
    assert source.source.data_ptr() == linear.weight.to_local().data_ptr() and source.source.shape == (4,)
    host = source.source
    source.source = torch.tensor([10.0, 20.0, 30.0, 40.0])  # what the next unshard copies from
    assert torch.equal(linear(torch.tensor([[1.0, 0.0]])), torch.tensor([[10.0, 30.0]]))
    linear.reshard()
    source.source = host
    assert torch.equal(linear(torch.tensor([[1.0, 0.0]])), torch.tensor([[1.0, 3.0]]))


def test_a_moved_fsdp2_shard_source_is_named(one_rank_group, monkeypatch):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    linear = fully_shard(torch.nn.Linear(2, 2), mesh=one_rank_group)
    monkeypatch.delattr(FSDPParam, "_sharded_param_data", raising=False)
    for param in linear._get_fsdp_state()._fsdp_param_group.fsdp_params:
        monkeypatch.delattr(param, "_sharded_param_data")
    with pytest.raises(RuntimeError, match="no longer provides FSDPParamGroup.fsdp_params' _sharded_param_data"):
        torch_private.fsdp_shard_sources(linear)


def _run_with_a_dtensor_op(rendezvous, extra_group: bool):
    """One run's worth: a 1-rank gloo group, a ("shard",) mesh on it (on a second group when ``extra_group``, as a
    run with one group more), an op on a DTensor over it; -> (the mesh, the op's output)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    if extra_group:
        mesh = DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu", mesh_dim_names=("shard",))
    else:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("shard",))
    return mesh, distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]) * 2


@pytest.mark.parametrize("end", ["end_process_group", "destroy_process_group"])
def test_a_later_run_never_meets_an_ended_runs_device_mesh(tmp_path, end):
    """The first run's mesh is on group "1", the second's on "0"; the meshes compare equal, so DTensor's cached
    output sharding of the same op would hand the second run the first's mesh, whose group is gone."""
    import torch.distributed as dist

    first, _ = _run_with_a_dtensor_op(tmp_path / "first", extra_group=True)
    assert first._dim_group_names == ["1"]
    (torch_private.end_process_group if end == "end_process_group" else dist.destroy_process_group)()
    try:
        mesh, out = _run_with_a_dtensor_op(tmp_path / "second", extra_group=False)
        assert mesh._dim_group_names == ["0"] and mesh == first
        if end == "destroy_process_group":  # torch's own teardown: the stale mesh, the failure users would meet
            assert out.device_mesh is first
            with pytest.raises(RuntimeError, match="Could not resolve the process group registered under the name 1"):
                out.device_mesh.get_group()  # what a collective on it asks first (distribute_tensor's scatter)
        else:
            assert out.device_mesh is mesh
            assert out.device_mesh.get_group() is dist.group.WORLD
    finally:
        torch_private.end_process_group()


def test_a_moved_sharding_cache_is_named(tmp_path, monkeypatch):
    import torch.distributed.tensor.debug as debug

    _run_with_a_dtensor_op(tmp_path / "rdzv", extra_group=False)
    monkeypatch.delattr(debug, "_clear_sharding_prop_cache")
    with pytest.raises(RuntimeError, match="no longer provides torch.distributed.tensor.debug._clear_sharding_prop"):
        torch_private.end_process_group()
    assert not torch.distributed.is_initialized()  # the group ended all the same
