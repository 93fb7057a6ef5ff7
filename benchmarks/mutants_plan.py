"""Mutants of shardtrain/plan/: shard-plan's trace, estimates and recommendation. Each mutant was seen to fail its
tests."""
from mutant_spec import Mutant

DECISIONS = "tests/plan/test_plan_decisions.py::"
EST = "shardtrain/plan/estimate.py"
RANK, FACTS = "shardtrain/trainer/memory/rank_memory.py", "shardtrain/trainer/run_facts.py"
LAYERS = "shardtrain/trainer/memory/layers.py"
MEASURE = "shardtrain/plan/measure.py"
ASYNC = "tests/trainer/test_async_save_memory.py::test_shard_plan_counts_the_async_save_host_copy"
WORLD = "tests/plan/test_plan_world_size.py::"
VERIFY = "tests/plan/test_plan_verify.py::"
PROGRESS = "tests/plan/test_plan_progress.py::"
HYBRID_MEASURED = ("tests/plan/test_plan_hybrid_measured.py::"
                   "test_the_hybrid_alternative_within_fifteen_percent_of_a_run_on_two_nodes_of_two")

MUTANTS = [
    Mutant("plan_ddp_buckets_dropped", "DDP's buckets are a second copy of the gradients",
           "shardtrain/trainer/parallel/ddp.py", 'GradientCopies(during_backward=0 if distributed.gradient_as_bucket_view else 1)',
           'GradientCopies(during_backward=0)',
           (DECISIONS + "test_ddp_buckets_are_a_second_copy_of_the_gradients",)),
    Mutant("plan_zero_not_divided", "ZeRO divides the optimizer state over the ranks",
           RANK, 'optimizer, master = optimizer // facts.zero_shards, master // facts.zero_shards',
           'optimizer, master = optimizer, master',
           (DECISIONS + "test_zero_divides_the_optimizer_state_over_the_ranks",)),
    Mutant("plan_update_freq_grads_dropped", "--update-freq keeps the first micro-batches' gradients",
           RANK, "grads_at_peak += max(0, grads - kinds[\"grads\"])", "grads_at_peak += 0",
           (DECISIONS + "test_update_freq_keeps_the_first_micro_batches_gradients",)),
    Mutant("plan_offload_stays_on_gpu", "--cpu-offload keeps the parameter and gradient shards in host memory",
           RANK, '"params": state_on_host, "grads": state_on_host,',
           '"params": False, "grads": False,',
           (DECISIONS + "test_a_gpu_run_keeps_offloaded_shards_and_cpu_optimizer_state_on_the_host",)),
    Mutant("plan_fsdp_gathers_once", "resharding after forward gathers the parameters again in backward",
           "shardtrain/trainer/parallel/fully_sharded.py", 'gathers = 2 if reshards_after_forward(distributed) else 1',
           'gathers = 1',
           (DECISIONS + "test_bytes_communicated_per_update",)),
    Mutant("plan_runtime_dropped", "the plan counts the kernels' own buffers",
           EST, "runtime=RUNTIME_BYTES[", "runtime=0 * RUNTIME_BYTES[", (DECISIONS + "test_the_kernels_own_buffers_are_counted",)),
    Mutant("plan_recommends_slowest", "the recommendation is the fastest that fits",
           "shardtrain/plan/planner.py", "min(fitting, key=lambda p: p.estimate.seconds)",
           "max(fitting, key=lambda p: p.estimate.seconds)", (DECISIONS + "test_the_recommendation_is_the_fastest_that_fits",)),
    Mutant("plan_host_not_shared", "a node's host memory is shared by its ranks",
           "shardtrain/plan/planner.py", "return est.host_peak * machine.ranks_per_node <= usable * machine.host_bytes",
           "return est.host_peak <= usable * machine.host_bytes",
           (DECISIONS + "test_the_recommendation_is_the_fastest_that_fits",)),
    Mutant("plan_trace_unsharded", "the trace shards over the run's world size",
           "shardtrain/plan/trace.py", 'DistributedContext(0, 0, sizes.world, CPU, "fake")',
           'DistributedContext(0, 0, 1, CPU, "fake")',
           (DECISIONS + "test_the_trace_shards_checkpoints_and_extrapolates",)),
    Mutant("plan_trace_not_checkpointed", "the trace applies activation checkpointing",
           "shardtrain/plan/trace.py", "    facts = run_facts(cfg, components, sizes.world, sizes.world,",
           "    facts = run_facts(with_overrides(cfg, {\"distributed.checkpoint_activations\": False}), components, "
           "sizes.world, sizes.world,",
           (DECISIONS + "test_the_trace_shards_checkpoints_and_extrapolates",)),
    Mutant("plan_extrapolation_off_by_one", "one- and two-layer traces extrapolate to the model's depth",
           LAYERS, "rest[key] + layers * per_layer[key]", "rest[key] + (layers + 1) * per_layer[key]",
           (DECISIONS + "test_the_trace_shards_checkpoints_and_extrapolates",)),
    # issue 37
    Mutant("plan_async_staging_not_counted", "shard-plan counts --async-save's host copy of the state",
           RANK, '        out["host"] += self.staged\n', '',
           (ASYNC, "tests/trainer/test_async_save_memory.py::"
                   "test_the_memory_check_counts_the_async_save_host_copy_on_every_rank_of_the_node")),
    Mutant("plan_async_staging_without_sharded_checkpoints", "only a backend writing sharded checkpoints saves "
           "in the background", FACTS,
           "    if not (c.async_save and backend.sharded_checkpoints) or c.no_save:",
           "    if not c.async_save or c.no_save:", (ASYNC,)),
    Mutant("plan_shard_grad_op_in_groups", "shard_grad_op shards over every rank whatever --shard-group-size",
           "shardtrain/trainer/parallel/fully_sharded.py", 'if strategy in ("full_shard", "shard_grad_op"):',
           'if strategy == "full_shard":',
           (WORLD + "test_shard_grad_op_shards_over_every_rank_whatever_the_shard_group_size",)),
    Mutant("plan_verify_resumes_the_users_run", "--verify measures in a scratch save dir, never resuming a run",
           MEASURE, '"checkpoint.save_dir": os.path.join(tmp, "checkpoints"),', "",
           (VERIFY + "test_verify_measures_in_scratch_beside_a_finished_run_and_leaves_it_alone",)),
    Mutant("plan_verify_median_of_nothing", "a measuring run without step times is one paragraph",
           MEASURE, "    return sorted(later)[len(later) // 2] if later else None\n",
           "    return sorted(later)[len(later) // 2]\n",
           (VERIFY + "test_a_measuring_run_without_step_times_is_one_paragraph",)),
    Mutant("plan_data_bin_checked_after_torch", "shard-plan checks the data-bin before it imports torch",
           "shardtrain/cli/plan.py", "    _check_data_bin(rest)  # the user's input first: then torch\n", "",
           (PROGRESS + "test_a_missing_or_wrong_data_bin_is_reported_before_torch_is_imported",)),
    Mutant("plan_traces_in_silence", "shard-plan logs a line per configuration planned",
           "shardtrain/plan/planner.py", '        progress(f"planned {which}: {option.label}"',
           '        (lambda what: None)(f"planned {which}: {option.label}"',
           (PROGRESS + "test_each_phase_and_each_configuration_traced_says_so_with_its_seconds",)),
    Mutant("plan_hybrid_trace_groups_every_rank", "a hybrid trace's mesh shards within a node's ranks, as the run",
           "shardtrain/plan/many_ranks.py", "    group = shards if hybrid else requested\n", "    group = requested\n",
           (WORLD + "test_hybrid_shard_without_a_group_size_shards_within_a_node_in_the_trace_as_in_the_estimate",
            HYBRID_MEASURED)),
    Mutant("plan_hybrid_shards_over_the_world", "the trace's shards are the backend's (a node's ranks for hybrid)",
           "shardtrain/plan/many_ranks.py", "parameter_shards(distributed, world_size, ranks_per_node)",
           "parameter_shards(distributed, world_size, world_size)",
           (WORLD + "test_hybrid_shard_without_a_group_size_shards_within_a_node_in_the_trace_as_in_the_estimate",
            HYBRID_MEASURED)),
    Mutant("plan_traces_on_one_node", "the planner traces with the machine's ranks per node",
           "shardtrain/plan/planner.py", "traced_peak(variant, task, machine.world_size, machine.ranks_per_node)",
           "traced_peak(variant, task, machine.world_size)",
           (WORLD + "test_the_planner_traces_hybrid_shard_within_a_node",)),
    Mutant("plan_trace_keeps_the_first_updates_peak", "the trace keeps the second update's peak, not the first's",
           "shardtrain/plan/trace.py", "                reset_tracker_peak(tracker)  #",
           "                (lambda tracker: None)(tracker)  #",
           (DECISIONS + "test_the_trace_keeps_the_second_updates_peak_as_a_second_trace_of_the_same_shapes",
            HYBRID_MEASURED)),
]
