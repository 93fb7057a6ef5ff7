"""Mutants of shardtrain/core/: the file lock, the registry, step timing, the private torch APIs. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

DEMO = "tests/e2e/test_demo.py::"
LOCK = "shardtrain/core/file_lock.py"
LINKS = "tests/core/test_file_lock_links.py::"
OWNER = LINKS + "test_the_owner_line_replaces_a_longer_stale_one_whole_and_names_the_holder"

MUTANTS = [
    Mutant("save_dir_lock_not_taken", "one run per save dir: a second is refused",
           "shardtrain/core/file_lock.py", "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", "pass",
           ("tests/trainer/checkpoint/test_save_dir_lock.py",)),
    Mutant("lock_follows_a_symlink", "a lock never writes through a link at its name (issue 37)",
           LOCK, "os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK", "os.O_RDWR | os.O_CREAT | os.O_NONBLOCK",
           (LINKS + "test_a_symlink_is_never_followed",)),
    Mutant("lock_takes_a_fifo", "a FIFO at a lock's name is one paragraph, never waited on",
           LOCK, "    if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:",
           "    if not stat.S_ISDIR(st.st_mode) and st.st_nlink <= 1:",
           (LINKS + "test_a_fifo_is_refused_without_waiting_for_a_writer",)),
    Mutant("lock_truncates_a_hard_link", "a lock never truncates a file that has other names",
           LOCK, "    if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:", "    if stat.S_ISREG(st.st_mode):",
           (LINKS + "test_a_hard_link_to_another_file_is_never_truncated",)),
    Mutant("lock_directory_traceback", "a directory at a lock's name is one paragraph",
           LOCK, "    if e.errno == errno.EISDIR or (e.errno in _NOT_WRITABLE and os.path.isdir(path)):",
           "    if False:", (LINKS + "test_a_directory_is_refused",)),
    Mutant("lock_read_only_traceback", "a read-only folder for a lock is one paragraph",
           LOCK, "    if e.errno not in _NOT_WRITABLE:\n        return None", "    if True:\n        return None",
           (LINKS + "test_a_read_only_folder_is_one_paragraph",)),
    Mutant("lock_stale_owner_tail_kept", "the owner line replaces a longer stale one whole",
           LOCK, "    os.ftruncate(fd, 0)", "    pass", (OWNER,)),
    Mutant("lock_owner_line_unnamed", "a refused run names the holder: pid and host",
           LOCK, 'f"pid {os.getpid()} on {socket.gethostname()}"', 'f"pid {os.getpid()}"', (OWNER,)),
    Mutant("lock_error_not_a_paragraph", "a lock name that is a link ends shard-train with exit 2 and one paragraph",
           LOCK, "class LockPathError(ShardtrainError):", "class LockPathError(OSError):",
           ("tests/cli/test_lock_file_refusals.py::test_shard_train_refuses_a_linked_save_dir_lock",)),
    Mutant("registry_accepts_duplicates", "every registry rejects duplicate names",
           "shardtrain/core/registry.py", "        if name in self._entries:\n            raise ConfigError(",
           "        if False:\n            raise ConfigError(",
           ("tests/core/test_registry.py",)),
    Mutant("slow_step_untimed", "a step that can take seconds says how long it took",
           "shardtrain/core/timing.py", '    logger.info("%s: done in %.1f s", what, time.perf_counter() - start)\n',
           "", (DEMO + "test_demo_runs_on_a_small_stdlib_corpus",)),
    Mutant("fake_mode_never_left", "shard-plan builds its model with real (meta) tensors inside the fake mode",
           "shardtrain/core/torch_private.py", "    return unset_fake_temporarily()",
           "    import contextlib\n    return contextlib.nullcontext()",
           ("tests/core/test_torch_private.py::test_fake_tensors_hold_no_memory_and_real_ones_come_back_inside",)),
    Mutant("dtensor_moved_to_the_mesh", "a DTensor built around a host shard keeps it in host memory",
           "shardtrain/core/torch_private.py",
           "    return DTensor(local, DTensorSpec(mesh, tuple(placements), tensor_meta=meta), requires_grad=False)",
           "    return DTensor.from_local(local, mesh, placements, shape=shape, stride=meta.stride)",
           ("tests/core/test_torch_private.py::test_a_dtensor_keeps_its_shard_where_it_is_and_a_moved_spec_is_named",)),
    Mutant("shape_propagation_counted", "DTensor's shape propagation is not counted as memory (torch 2.11 counted "
           "it at every step: the hybrid plan 65% high)", "shardtrain/core/torch_private.py",
           "        if not depth[0]:\n            track(*args, **kwargs)", "        track(*args, **kwargs)",
           ("tests/core/test_torch_private.py::test_dtensors_shape_propagation_is_not_counted_as_optimizer_state",)),
]
