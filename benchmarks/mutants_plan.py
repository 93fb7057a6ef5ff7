"""Mutants of shardtrain/plan/: shard-plan's trace, estimates and recommendation. Each mutant was seen to fail its
tests."""
from mutant_spec import Mutant

DECISIONS = "tests/plan/test_plan_decisions.py::"
EST = "shardtrain/plan/estimate.py"

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
]
