"""Issue 28, item 4, the run side: the validation RNG on the GPU, the one-GPU run's current device, host
memory under a cgroup limit, --spike-rollback's snapshot in the memory check and shard-plan. Each mutant
was seen to fail its tests (on the CPU; tests/gpu/test_run_devices_gpu.py needs a GPU)."""
from mutant_spec import Mutant

DEV = "tests/trainer/test_run_devices.py::"
HOST = "tests/trainer/memory/test_host_memory.py::"
SNAP = "tests/trainer/memory/test_spike_snapshot_memory.py::"
ASYNC = "tests/trainer/test_async_save_memory.py::"
LOOP, START, HM = "shardtrain/trainer/loop.py", "shardtrain/trainer/launch/start.py", "shardtrain/trainer/memory/host_memory.py"
FIT, EST = "shardtrain/trainer/memory/fit.py", "shardtrain/plan/estimate.py"
RANK, FACTS = "shardtrain/trainer/memory/rank_memory.py", "shardtrain/trainer/run_facts.py"
VALIDATION = "shardtrain/trainer/validation.py"
DROPOUT = DEV + "test_a_fixed_validation_seed_leaves_training_gpu_dropout_stream_alone"
ONE_GPU = (DEV + "test_a_one_gpu_run_without_a_process_group_sets_its_device_before_main",
           DEV + "test_a_one_rank_launch_on_another_gpu_makes_that_gpu_current")
COUNTED = SNAP + "test_the_memory_check_counts_the_snapshot_where_it_lives"
_FORK = "    return torch.random.fork_rng(devices=[device], device_type=device.type)"
_SET_THEN_MAIN = ("    if ctx.device.type == \"cuda\":\n        torch.cuda.set_device(ctx.device)\n"
                  "    if ctx.backend is None:\n        return main(cfg, ctx)\n")

MUTANTS = [
    Mutant("validation_forks_cpu_rng_only", "--fixed-validation-seed leaves training's GPU dropout stream alone",
           VALIDATION, _FORK, "    return torch.random.fork_rng(devices=[])", (DROPOUT,)),
    Mutant("validation_forks_every_gpu", "validation reads the rank's own GPU generator only (no context elsewhere)",
           VALIDATION, _FORK, "    return torch.random.fork_rng(devices=range(2), device_type=device.type)", (DROPOUT,)),
    Mutant("cpu_validation_reads_gpu_rng", "a --cpu run's validation reads no GPU generator",
           VALIDATION, "        return torch.random.fork_rng(devices=[])\n", "        return torch.random.fork_rng()\n",
           (DEV + "test_a_cpu_run_reads_no_gpu_generator_when_validating",)),
    Mutant("fallback_init_reseeds_gpus", "an unrecognised init function re-seeds no GPU generator",
           "shardtrain/models/init.py", "        torch.default_generator.manual_seed(_block_seed(key, -1))",
           "        torch.manual_seed(_block_seed(key, -1))", (DEV + "test_the_fallback_init_reseeds_no_gpu_generator",)),
    Mutant("one_gpu_run_sets_no_device", "a run without a process group makes its GPU current before main",
           START, _SET_THEN_MAIN,
           "    if ctx.backend is None:\n        return main(cfg, ctx)\n    if ctx.device.type == \"cuda\":\n"
           "        torch.cuda.set_device(ctx.device)\n", ONE_GPU),
    Mutant("cgroup_ignored", "host memory is the least of MemAvailable and the cgroup's headroom",
           HM, "    for headroom, where in cgroup_headrooms(root):", "    for headroom, where in []:",
           (HOST + "test_v2_limit_binds_less_its_reclaimable_cache",)),
    Mutant("cgroup_parents_ignored", "a parent cgroup's limit binds its children",
           HM, "    return [\"/\".join(parts[:n]) for n in range(len(parts), -1, -1)]", "    return [\"/\".join(parts)]",
           (HOST + "test_a_parents_limit_binds_its_children",)),
    Mutant("cgroup_v1_ignored", "a cgroup v1 memory limit binds", HM, '        elif "memory" in controllers.split(","):',
           "        elif False:", (HOST + "test_v1_limit_binds",)),
    Mutant("cgroup_cache_counted_as_used", "reclaimable page cache is not counted as used",
           HM, "    used = max(0, usage - (_stat(os.path.join(directory, \"memory.stat\"), reclaimable) or 0))",
           "    used = usage", (HOST + "test_v2_limit_binds_less_its_reclaimable_cache",)),
    Mutant("refusal_says_mem_available_under_cgroup", "a refusal names the cgroup limit when it binds",
           FIT, "        available, host_source = {\"host\": host.available}, host.source",
           "        available, host_source = {\"host\": host.available}, \"MemAvailable\"",
           (HOST + "test_the_refusal_names_the_cgroup_limit_when_it_binds",)),
    Mutant("snapshot_not_checked", "the memory check counts --spike-rollback's snapshot",
           FACTS, "first(cfg.optimization.update_freq), bool(cfg.optimization.spike_rollback), ",
           "first(cfg.optimization.update_freq), False, ", (COUNTED,)),
    Mutant("offloaded_snapshot_on_the_gpu", "under --cpu-offload the snapshot of the state is in host memory",
           RANK, '        out[where] += copies * size\n',
           '        out[where] += size\n        out["host" if device_type == "cpu" else "device"] += (copies - 1) * size\n',
           (COUNTED, SNAP + "test_shard_plan_keeps_an_offloaded_runs_snapshot_of_the_state_in_host_memory")),
    Mutant("snapshot_buffers_follow_the_state", "the snapshot of the buffers stays on the GPU under --cpu-offload",
           RANK, '"optimizer": optimizer_on_host, "master": optimizer_on_host}',
           '"optimizer": optimizer_on_host, "master": optimizer_on_host, "buffers": state_on_host}',
           (COUNTED,)),
    Mutant("snapshot_once_per_host", "each rank on a host holds its own snapshot",
           FIT, '    needs["host"] *= ranks_on_host\n',
           '    needs["host"] = needs["host"] * ranks_on_host - (ranks_on_host - 1) * est.snapshot\n',
           (COUNTED,)),
    Mutant("plan_snapshot_not_counted", "shard-plan counts --spike-rollback's snapshot at the peak",
           RANK, "snapshots=1 if facts.snapshot else 0", "snapshots=0",
           tuple(SNAP + f"test_shard_plan_counts_the_snapshot[{d}]" for d in ("cpu", "cuda"))),
    Mutant("plan_snapshot_without_buffers", "shard-plan's snapshot copies the buffers too",
           RANK, 'SNAPSHOT_KINDS = ("params", "optimizer", "master", "buffers")',
           'SNAPSHOT_KINDS = ("params", "optimizer", "master")',
           (SNAP + "test_shard_plan_counts_the_snapshot[cpu]",)),
    # issue 37, item 1: --async-save's pinned host copy of the state on the GPU, in the memory check
    Mutant("fit_async_staging_once_per_node", "every rank of a node keeps its own --async-save host copy",
           FIT, '    needs["host"] *= ranks_on_host\n',
           '    needs["host"] = (needs["host"] - est.staged) * ranks_on_host + est.staged\n',
           (ASYNC + "test_the_memory_check_counts_the_async_save_host_copy_on_every_rank_of_the_node",)),
    Mutant("fit_async_staging_not_estimated", "the run's estimate holds what --async-save stages",
           RANK, "staged=staged, device_type=device_type,", "staged=0, device_type=device_type,",
           (ASYNC + "test_the_memory_check_counts_the_async_save_host_copy_on_every_rank_of_the_node",)),
    Mutant("async_staging_copies_host_state", "state in host memory is written live by --async-save, never copied",
           RANK,
           '    return place(saved, device_type, facts.state_on_host, facts.optimizer_on_host, snapshot=False)["device"]\n',
           '    return sum(saved.values())\n', (ASYNC + "test_state_in_host_memory_is_written_live_so_nothing_is_staged",)),
]
