"""Mutants of shardtrain/core/: the file lock, the registry, step timing, the private torch APIs. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

DEMO = "tests/cli/test_demo.py::"

MUTANTS = [
    Mutant("save_dir_lock_not_taken", "one run per save dir: a second is refused",
           "shardtrain/core/file_lock.py", "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)", "pass",
           ("tests/cli/test_save_dir_lock.py",)),
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
]
