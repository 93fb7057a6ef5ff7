"""Mutants of shard-plan's time model (shardtrain/plan/estimate.py, planner.py, report.py): each piece priced
on the device that runs it, and the printout saying which speeds were measured, given or assumed and what its
memory figures are (tests/plan/test_plan_time.py). Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

EST, PLANNER, REPORT = "shardtrain/plan/estimate.py", "shardtrain/plan/planner.py", "shardtrain/plan/report.py"
TIME = "tests/plan/test_plan_time.py::"
GPU = TIME + "test_a_gpu_optimizer_runs_at_the_gpus_memory_bandwidth"
README = TIME + "test_readme_example_spends_under_five_percent_of_the_step_in_the_optimizer"
HOST = TIME + "test_an_optimizer_on_the_cpu_runs_at_the_hosts_copy_speed"
FLAG = TIME + "test_gpu_memory_gbps_prices_the_gpu_optimizer_and_says_it_was_given"
SAID = TIME + "test_the_printout_says_what_was_measured_given_or_assumed"

MUTANTS = [
    Mutant("plan_gpu_optimizer_at_host_copy_speed", "a GPU optimizer steps at the GPU's memory bandwidth",
           EST, 'return machine.copy_gbps if optimizer_device(cfg, machine) == "cpu" else machine.gpu_memory_gbps',
           "return machine.copy_gbps", (GPU, README)),
    Mutant("plan_offloaded_optimizer_on_gpu", "cpu_adam and --cpu-offload step the optimizer at the host's copy speed",
           EST, 'return "cpu" if machine.device == "cpu" or optimizer_steps_on_host(cfg) else machine.device',
           'return "cpu" if machine.device == "cpu" else machine.device', (HOST,)),
    Mutant("plan_gpu_memory_gbps_ignored", "--gpu-memory-gbps prices a GPU optimizer",
           PLANNER, '    if given:\n        return given, "given"', '    if False:\n        return given, "given"',
           (FLAG,)),
    Mutant("plan_speed_sources_unsaid", "each speed says whether it was measured here, given or assumed",
           REPORT, "return f\"({m.sources.get(key, 'given')})\"", 'return ""', (SAID, FLAG)),
    Mutant("plan_memory_baseline_unsaid", "the memory figures say they are above the process's baseline",
           REPORT, 'f"as given, per rank; {BASELINE}:",', '"as given, per rank:",', (SAID,)),
    # issue 37, item 2: the time model beyond the simplest setup
    Mutant("plan_offload_once_per_update", "--cpu-offload's copies run every micro-batch of --update-freq",
           EST, "return cfg.optimization.update_freq[0] * 2 * 4 * count // facts.shards",
           "return 2 * 4 * count // facts.shards", (TIME + "test_offload_copies_run_every_micro_batch",)),
    Mutant("plan_zero_broadcast_dropped", "ZeRO broadcasts each rank's updated partition",
           EST, "total += int((world - 1) / world * count * facts.param_bytes)", "total += 0",
           (TIME + "test_zero_broadcasts_each_ranks_updated_partition",)),
    Mutant("plan_zero_broadcast_whole", "a rank receives the other ranks' partitions, (world - 1) / world of them",
           EST, "total += int((world - 1) / world * count * facts.param_bytes)",
           "total += int(count * facts.param_bytes)", (TIME + "test_zero_broadcasts_each_ranks_updated_partition",)),
    Mutant("plan_offload_activations_not_recomputed", "--offload-activations recomputes the forward in backward",
           EST, "recompute = 4 / 3 if (d.checkpoint_activations or d.offload_activations) else 1.0",
           "recompute = 4 / 3 if d.checkpoint_activations else 1.0",
           (TIME + "test_offloaded_activations_are_recomputed_as_checkpointed_ones",)),
]
