"""Mutants of shardtrain/plan/: shard-plan's trace, estimates and recommendation. Each mutant was seen to fail its
tests."""
from mutant_spec import Mutant

DECISIONS = "tests/plan/test_plan_decisions.py::"
EST = "shardtrain/plan/estimate.py"
MEASURE = "shardtrain/plan/measure.py"
ASYNC = "tests/trainer/test_async_save_memory.py::test_shard_plan_counts_the_async_save_host_copy"
WORLD = "tests/plan/test_plan_world_size.py::"
VERIFY = "tests/plan/test_plan_verify.py::"
PROGRESS = "tests/plan/test_plan_progress.py::"

MUTANTS = [
    Mutant("plan_ddp_buckets_dropped", "DDP's buckets are a second copy of the gradients",
           "shardtrain/trainer/parallel/ddp.py", 'GradientCopies(during_backward=0 if distributed.gradient_as_bucket_view else 1)',
           'GradientCopies(during_backward=0)',
           (DECISIONS + "test_ddp_buckets_are_a_second_copy_of_the_gradients",)),
    Mutant("plan_zero_not_divided", "ZeRO divides the optimizer state over the ranks",
           EST, 'optimizer, master = optimizer // facts.zero_shards, master // facts.zero_shards',
           'optimizer, master = optimizer, master',
           (DECISIONS + "test_zero_divides_the_optimizer_state_over_the_ranks",)),
    Mutant("plan_update_freq_grads_dropped", "--update-freq keeps the first micro-batches' gradients",
           EST, "peak += max(0, grads - kinds[\"grads\"])", "peak += 0",
           (DECISIONS + "test_update_freq_keeps_the_first_micro_batches_gradients",)),
    Mutant("plan_offload_stays_on_gpu", "--cpu-offload keeps the parameter and gradient shards in host memory",
           "shardtrain/trainer/rank_memory.py", '"params": state_on_host, "grads": state_on_host,',
           '"params": False, "grads": False,',
           (DECISIONS + "test_a_gpu_run_keeps_offloaded_shards_and_cpu_optimizer_state_on_the_host",)),
    Mutant("plan_fsdp_gathers_once", "resharding after forward gathers the parameters again in backward",
           "shardtrain/trainer/parallel/fully_sharded.py", 'gathers = 2 if reshards_after_forward(distributed) else 1',
           'gathers = 1',
           (DECISIONS + "test_bytes_communicated_per_update",)),
    Mutant("plan_runtime_dropped", "the plan counts the kernels' own buffers",
           EST, "peak += extra + runtime", "peak += extra", (DECISIONS + "test_the_kernels_own_buffers_are_counted",)),
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
           "shardtrain/plan/trace.py", 'd.checkpoint_activations_every if checkpointing else None))',
           'None))',
           (DECISIONS + "test_the_trace_shards_checkpoints_and_extrapolates",)),
    Mutant("plan_extrapolation_off_by_one", "one- and two-layer traces extrapolate to the model's depth",
           "shardtrain/plan/trace.py", "one[k] + (layers - 1) * (two[k] - one[k])", "one[k] + layers * (two[k] - one[k])",
           (DECISIONS + "test_the_trace_shards_checkpoints_and_extrapolates",)),
    # issue 37
    Mutant("plan_async_staging_not_counted", "shard-plan counts --async-save's host copy of the state",
           EST, '    host = (peak if machine.device == "cpu" else host) + staged\n',
           '    host = peak if machine.device == "cpu" else host\n', (ASYNC,)),
    Mutant("plan_async_staging_without_sharded_checkpoints", "only a backend writing sharded checkpoints saves "
           "in the background", "shardtrain/trainer/rank_memory.py",
           "    if not (c.async_save and backend.sharded_checkpoints) or c.no_save:",
           "    if not c.async_save or c.no_save:", (ASYNC,)),
    Mutant("plan_shard_grad_op_in_groups", "shard_grad_op shards over every rank whatever --shard-group-size",
           "shardtrain/plan/many_ranks.py", 'if strategy in ("full_shard", "shard_grad_op"):',
           'if strategy == "full_shard":',
           (WORLD + "test_shard_grad_op_shards_over_every_rank_whatever_the_shard_group_size",)),
    Mutant("plan_verify_resumes_the_users_run", "--verify measures in a scratch save dir, never resuming a run",
           MEASURE, '            run.checkpoint.save_dir = os.path.join(tmp, "checkpoints")\n', "",
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
]
