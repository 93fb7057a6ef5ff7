"""Mutants of --async-save's staging, caught through the GPU rank's path: with no copy-everything mode left in
the product (its baseline is in checkpoint_baselines.py), the 2-rank test stages as a GPU rank does (a stand-in
says every tensor is on a GPU). Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

STAGING = T + "checkpoint/async_staging.py"
ASYNC_CPU = "tests/trainer/checkpoint/test_async_save_cpu.py::test_async_save_writes_the_state_at_save"
GPU_RANK = ("tests/trainer/checkpoint/test_checkpoint_cuda_free.py::"
            "test_a_gpu_ranks_async_save_waits_for_its_own_device_once_and_its_writer_touches_none")

KEYS = "tests/trainer/checkpoint/test_run_stager_keys.py::"
VIEWS = "test_views_of_one_storage_with_other_shapes_or_strides_are_staged_apart_and_restaged"

MUTANTS = [
    Mutant("gpu_state_written_live", "GPU state is copied to the host before save() returns, never written live",
           STAGING, 'live = device.type == "cpu" and local.numel() > 1', "live = local.numel() > 1",
           (GPU_RANK, ASYNC_CPU)),
    # issue 37: the buffers' keys, by state-dict path and by view of a storage
    Mutant("staging_list_items_one_path", "tensors at list positions keep their own buffers",
           STAGING, 'return type(value)(_rebuild(item, f"{path}/{i}", tensor_fn) for i, item in enumerate(value))',
           'return type(value)(_rebuild(item, f"{path}/", tensor_fn) for i, item in enumerate(value))',
           (KEYS + "test_tensors_at_list_positions_keep_their_own_buffers_and_values",)),
    Mutant("staging_views_share_by_storage", "views of one storage with other shapes are staged apart",
           STAGING, "source = (local.device, local.data_ptr(), tuple(local.shape), local.stride(), local.dtype)",
           "source = (local.device, local.data_ptr(), local.dtype)", (KEYS + VIEWS,)),
    Mutant("staging_view_key_without_shape", "views of one storage with other shapes are staged apart",
           STAGING, "source = (local.device, local.data_ptr(), tuple(local.shape), local.stride(), local.dtype)",
           "source = (local.device, local.data_ptr(), local.stride(), local.dtype)", (KEYS + VIEWS,)),
    Mutant("staging_view_key_without_stride", "views of one storage with other strides are staged apart",
           STAGING, "source = (local.device, local.data_ptr(), tuple(local.shape), local.stride(), local.dtype)",
           "source = (local.device, local.data_ptr(), tuple(local.shape), local.dtype)", (KEYS + VIEWS,)),
    Mutant("staging_paths_alike_share", "entries whose paths read alike keep their own buffers",
           STAGING, "        while path in kept:", "        while False:",
           (KEYS + "test_entries_whose_paths_read_alike_keep_their_own_buffers",)),
]
