"""Mutants of --async-save's staging, caught through the GPU rank's path: with no copy-everything mode left in
the product (its baseline is in checkpoint_baselines.py), the 2-rank test stages as a GPU rank does (a stand-in
says every tensor is on a GPU). Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

STAGING = T + "checkpoint/async_staging.py"
ASYNC_CPU = "tests/distributed/test_async_save_cpu.py::test_async_save_writes_the_state_at_save"
GPU_RANK = ("tests/trainer/test_checkpoint_cuda_free.py::"
            "test_a_gpu_ranks_async_save_waits_for_its_own_device_once_and_its_writer_touches_none")

MUTANTS = [
    Mutant("gpu_state_written_live", "GPU state is copied to the host before save() returns, never written live",
           STAGING, 'live = device.type == "cpu" and local.numel() > 1', "live = local.numel() > 1",
           (GPU_RANK, ASYNC_CPU)),
]
