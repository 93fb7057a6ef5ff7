"""Mutants of shardtrain/trainer/checkpoint/'s writing side: atomic saves, COMPLETE, consolidate,
--no-save-optimizer-state, --async-save's gate; and issue 28, item 4: sharded saves of host state make no CUDA
call, --async-save's staging buffers are shardtrain's own (reused by every save, pinned for GPU state), and a
--spike-rollback waits for the background write of live tensors. Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

CK = "shardtrain/trainer/checkpoint/"
STAGING = CK + "async_staging.py"
CUDA_FREE = "tests/trainer/checkpoint/test_checkpoint_cuda_free.py::"
HOST_SAVE = CUDA_FREE + "test_a_save_of_host_state_makes_no_cuda_call"
GPU_RANK = CUDA_FREE + "test_a_gpu_ranks_async_save_waits_for_its_own_device_once_and_its_writer_touches_none"
STAGER = "tests/trainer/checkpoint/test_run_stager.py::"
REUSE = STAGER + "test_consecutive_stages_refill_the_same_buffers_with_the_values_at_stage"
ASYNC_CPU = "tests/trainer/checkpoint/test_async_save_cpu.py::test_async_save_writes_the_state_at_save"

MUTANTS = [
    Mutant("writer_copies_ahead_host_state", "a --cpu run's sharded saves open no CUDA context",
           CK + "checksums.py", '**({"per_thread_copy_ahead": 0} if state_on_host else {})', "",
           (HOST_SAVE, CUDA_FREE + "test_a_cpu_run_saving_sharded_checkpoints_makes_no_cuda_call", GPU_RANK)),
    Mutant("consolidate_copies_ahead_host_state", "shard-consolidate's file -> directory opens no CUDA context",
           CK + "consolidate.py", "state_on_host=on_host(tensors)", "state_on_host=False",
           (CUDA_FREE + "test_converting_a_checkpoint_file_to_a_sharded_directory_makes_no_cuda_call",)),
    Mutant("staging_buffers_not_reused", "--async-save's buffers are allocated once and refilled by every save",
           STAGING, "buffer, was_pinned = self._buffers.get(path, (None, None))", "buffer, was_pinned = None, None",
           (REUSE, ASYNC_CPU)),
    Mutant("staging_buffers_kept_forever", "a staging buffer no state entry uses any more is dropped",
           STAGING, "self._buffers = kept  #", "self._buffers.update(kept)  #",
           (STAGER + "test_a_changed_entry_gets_a_new_buffer_a_gone_one_is_dropped_and_close_frees_all",)),
    Mutant("staging_not_pinned", "GPU state is staged in pinned host memory",
           STAGING, 'pinned = device.type == "cuda"', "pinned = False", (GPU_RANK,)),
    Mutant("staging_copies_blocking", "GPU state is copied to the host non-blocking",
           STAGING, "self.memory.copy(buffer, local, non_blocking=pinned)",
           "self.memory.copy(buffer, local, non_blocking=False)", (GPU_RANK,)),
    Mutant("staging_no_wait", "save() returns only once the non-blocking copies have landed",
           STAGING, "            self.memory.synchronize(device)", "            pass", (GPU_RANK,)),
    Mutant("staging_aliases_copied_twice", "tied weights are staged once",
           STAGING, "if source not in copies:", "if True:", (REUSE,)),
    Mutant("rollback_races_async_write", "a rollback waits for the async write of live tensors",
           "shardtrain/trainer/spike.py", "if wait_for_live_writes():", "if False:",
           ("tests/trainer/checkpoint/test_async_save_rollback.py::"
            "test_a_rollback_during_an_async_write_leaves_the_checkpoint_whole",)),
    Mutant("gate_forgets_its_write", "wait_for_live_writes sees every write still running",
           STAGING, "        _HELD.add(self)\n", "",
           ("tests/trainer/checkpoint/test_async_save_rollback.py::"
            "test_a_rollback_during_an_async_write_leaves_the_checkpoint_whole",)),
    Mutant("async_save_gate_missing", "--async-save: the next optimizer step waits until the write has landed",
           T + "checkpoint/async_staging.py", "        self.waited += 1\n        self._released.wait()\n",
           "        self.waited += 1\n",
           ("tests/trainer/checkpoint/test_async_save_cpu.py",)),
    Mutant("consolidate_drops_optimizer", "shard-consolidate without --model-only keeps the full training state",
           T + "checkpoint/consolidate.py", 'keys = {"model"} if model_only else {"model", "optimizer"}',
           'keys = {"model"}',
           ("tests/trainer/checkpoint/test_consolidate.py",)),
    Mutant("consolidate_overwrites", "an existing output is never replaced unless you pass --overwrite",
           T + "checkpoint/consolidate.py", "    if not overwrite:\n        raise CheckpointError(f\"The output {path} exists;",
           "    if False:\n        raise CheckpointError(f\"The output {path} exists;",
           ("tests/trainer/checkpoint/test_consolidate.py::test_existing_outputs_are_refused_in_every_direction_unless_overwrite",)),
    Mutant("no_save_optimizer_state_saves_it", "--no-save-optimizer-state: the checkpoint holds no optimizer state",
           "shardtrain/trainer/checkpoint/manager.py", 'NO_OPTIMIZER_STATE: True}, without(parts, ["optimizer"])',
           "NO_OPTIMIZER_STATE: True}, parts",
           ("tests/trainer/checkpoint/test_no_save_optimizer_state.py",)),
    Mutant("sharded_rename_before_complete", "a directory appears under its name only when COMPLETE is written",
           T + "checkpoint/sharded_saver.py",
           "    atomic_write_bytes(os.path.join(partial, COMPLETE), complete)\n"
           "    fsync_dir(partial)\n    replace_dir(partial, final)\n",
           "    replace_dir(partial, final)\n"
           "    atomic_write_bytes(os.path.join(final, COMPLETE), complete)\n"
           "    fsync_dir(final)\n",
           ("tests/trainer/checkpoint/test_save_crash_phases.py",)),
    Mutant("single_file_save_not_atomic", "checkpoints are written atomically (temporary file, fsync, rename)",
           T + "checkpoint/single_file.py", "    with atomic_open(path) as f:\n        writer = _WriteErrors(f)\n",
           '    with open(path, "wb") as f:\n        writer = _WriteErrors(f)\n',
           ("tests/trainer/checkpoint/test_full_disk.py", "tests/trainer/checkpoint/test_save_crash_phases.py")),
    # issue 45 item 4.12: the NaN stop names a sharded checkpoint as the directory it is
    Mutant("sharded_checked_save_named_as_a_file", "the NaN stop names a sharded checkpoint as a directory",
           "shardtrain/trainer/checkpoint/sharded.py", "    saves_directories = True\n", "    saves_directories = False\n",
           ("tests/trainer/checkpoint/test_checked_save_name.py::test_a_sharded_checkpoint_is_named_as_a_directory",)),
]
