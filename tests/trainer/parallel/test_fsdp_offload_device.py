"""--cpu on a GPU machine: what fully_sharded builds depends on the run's device,
never on whether the machine has a GPU (tests/gpu/test_cpu_flag_no_cuda.py checks
the CUDA context itself on a GPU machine)."""
import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.one_rank_group import OneRankGroup
from shardtrain.trainer.parallel.choose import build_backend
from shardtrain.trainer.parallel.fsdp_wrap import offload_policy, shard_group_size
from shardtrain.trainer.parallel.prepare import prepare_model
from shardtrain.trainer.precision.choose import run_dtypes
from shardtrain.trainer.launch.start import make_context
from st_testutils import TwoBlocks

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture
def gpu_machine(monkeypatch):
    """This process believes 8 GPUs are visible (none is touched: a context cannot be made here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_offload_pins_memory_only_for_a_cuda_run(gpu_machine):
    assert isinstance(offload_policy(True, CPU), CPUOffloadPolicy) and not offload_policy(True, CPU).pin_memory
    assert offload_policy(True, GPU).pin_memory
    assert not isinstance(offload_policy(False, GPU), CPUOffloadPolicy)


def test_hybrid_shard_group_is_the_launch_s_ranks_a_node_never_the_gpus(gpu_machine):
    assert shard_group_size(16, None, ranks_per_node=16) == 16  # a --cpu run's ranks: the 8 GPUs are not its ranks
    assert shard_group_size(16, None, ranks_per_node=2) == 2
    assert shard_group_size(16, 4, ranks_per_node=2) == 4


@pytest.mark.flag_effect("--cpu")
def test_a_cpu_run_wraps_with_unpinned_shards_on_a_gpu_machine(gpu_machine, tmp_path):
    # Pinning on this CPU-only torch raises, so this also fails if the backend pins.
    cfg = parse_train_args([str(tmp_path), "--cpu", "--ddp-backend", "fully_sharded", "--cpu-offload"])
    with OneRankGroup(CPU):  # as a one-process run starts it for fully_sharded
        backend = build_backend(cfg, make_context(0, 0, 1, use_cuda=False, backend=None), run_dtypes(cfg))
        model = prepare_model(TwoBlocks, backend, seed=1)  # built on the meta device, sharded, materialised
        shards = [p.to_local() for p in model.parameters()]
        assert shards and all(s.device.type == "cpu" and not s.is_pinned() for s in shards)
