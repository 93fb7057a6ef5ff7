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
OVERLAP = "tests/plan/test_plan_overlap.py::"

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
           EST, "return facts.update_freq * 2 * 4 * count // facts.shards",
           "return 2 * 4 * count // facts.shards", (TIME + "test_offload_copies_run_every_micro_batch",)),
    Mutant("plan_zero_broadcast_dropped", "ZeRO broadcasts each rank's updated partition",
           EST, "total += int((world - 1) / world * count * facts.param_bytes)", "total += 0",
           (TIME + "test_zero_broadcasts_each_ranks_updated_partition",)),
    Mutant("plan_zero_broadcast_whole", "a rank receives the other ranks' partitions, (world - 1) / world of them",
           EST, "total += int((world - 1) / world * count * facts.param_bytes)",
           "total += int(count * facts.param_bytes)", (TIME + "test_zero_broadcasts_each_ranks_updated_partition",)),
    Mutant("plan_offload_activations_not_recomputed", "--offload-activations recomputes the forward in backward",
           "shardtrain/trainer/parallel/activation_checkpointing.py",
           "    on = distributed.checkpoint_activations or distributed.offload_activations",
           "    on = distributed.checkpoint_activations",
           (TIME + "test_offloaded_activations_are_recomputed_as_checkpointed_ones",)),
    # the CPU step during backward (issue 39): tests/plan/test_plan_overlap.py
    Mutant("plan_overlap_ignores_the_roots_share", "only the blocks' share of the CPU step hides under backward",
           EST, "-min(seconds[\"optimizer\"] * block_share, backward)", "-min(seconds[\"optimizer\"], backward)",
           (OVERLAP + "test_the_blocks_step_hides_under_the_last_backward_up_to_its_length",)),
    Mutant("plan_overlap_whole_step_as_backward", "the step hides under the backward only, not the forward",
           EST, "(3 / 4 if checkpointed else 2 / 3)", "(3 / 4 if checkpointed else 1.0)",
           (OVERLAP + "test_the_blocks_step_hides_under_the_last_backward_up_to_its_length",)),
    Mutant("plan_overlap_every_micro_batch", "--update-freq: only the last micro-batch's backward hides the step",
           EST, "seconds[\"compute\"] / update_freq *", "seconds[\"compute\"] *",
           (OVERLAP + "test_only_the_last_micro_batch_backward_hides_the_step",)),
    Mutant("plan_overlap_recompute_ignored", "a checkpointed backward recomputes the forward: longer",
           EST, "(3 / 4 if checkpointed else 2 / 3)", "(2 / 3)",
           (OVERLAP + "test_checkpointed_activations_lengthen_the_backward_by_the_recomputed_forward",)),
    Mutant("plan_overlap_despite_the_flag", "--cpu-step after-backward: no overlap priced (the run's decision)",
           EST, "    return facts.cpu_step_after_backward(machine.device) is None",
           "    return facts.cpu_step_cannot(machine.device) is None",
           (OVERLAP + "test_no_overlap_where_the_run_steps_after_backward",)),
    Mutant("plan_overlap_upload_both_ways", "the upload is the parameters' half of the copies",
           EST, "\"offload_upload\": s[\"offload\"] / 2", "\"offload_upload\": s[\"offload\"]",
           (OVERLAP + "test_the_record_fields_predicted",)),
    Mutant("plan_overlap_block_share_one_layer_short", "the blocks' share counts every layer",
           "shardtrain/trainer/memory/model_sizes.py",
           "    return layers * per_layer[\"count\"] / total if layers and total else 1.0",
           "    return (layers - 1) * per_layer[\"count\"] / total if layers and total else 1.0",
           (OVERLAP + "test_the_blocks_share_of_the_parameters",)),
    Mutant("plan_verify_without_split", "a measuring run returns its records' split",
           "shardtrain/plan/measure.py", "        if \"offload\" in out:", "        if False:",
           (OVERLAP + "test_a_measuring_run_returns_the_median_of_its_records_fields",)),
    Mutant("plan_verify_prints_planned_as_measured", "--verify prints each field measured beside predicted",
           "shardtrain/plan/measure.py", "{measured[key]:>9.3f} {unit} measured", "{predicted[key]:>9.3f} {unit} measured",
           (OVERLAP + "test_verify_prints_each_field_measured_beside_predicted",)),
    Mutant("plan_overlap_not_printed", "the printout says how much of the CPU step hides",
           REPORT, "    if \"hidden\" in e.step_seconds:", "    if False:",
           (OVERLAP + "test_the_printout_says_how_much_of_the_cpu_step_hides",)),
    Mutant("plan_overlap_auto_on_a_cpu_run", "--cpu-step auto prices no overlap on a CPU run",
           EST, "facts.cpu_step_after_backward(machine.device)", "facts.cpu_step_after_backward(\"cuda\")",
           (OVERLAP + "test_a_cpu_run_steps_after_backward_unless_told_otherwise",)),
    Mutant("run_facts_update_freq_as_a_list_only", "--update-freq may be a number as well as a per-epoch list",
           "shardtrain/trainer/run_facts.py", "first(cfg.optimization.update_freq), ",
           "cfg.optimization.update_freq[0], ",
           (OVERLAP + "test_the_run_facts_read_the_first_epochs_update_freq_in_any_form",
            "tests/trainer/parallel/test_collective_counts.py::test_every_variant_trains_the_same")),
]
