"""Issue 29, red-team items 6-9 (bad input and exhausted resources as one paragraph, shard-plan for many
ranks, a requeue that fails, shard-plot's all-nan panels). Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

RES = "tests/cli/test_bad_input_resources.py::"
PRE = "tests/trainer/launch/test_preemption.py::"
WORLD = "tests/plan/test_plan_world_size.py::"
NAN = "tests/plot/test_plot_nonfinite.py::"

MUTANTS = [
    Mutant("plan_accepts_inf_memory", "shard-plan refuses --gpu-memory inf (and nan, 0, negative) in one paragraph",
           "shardtrain/cli/plan.py", "not (value > 0 and math.isfinite(value))", "not value > 0",
           (RES + "test_shard_plan_refuses_memory_and_speeds_that_are_not_amounts",)),
    Mutant("interactive_binary_input_traceback", "shard-interactive refuses a binary --input in one paragraph",
           "shardtrain/cli/interactive.py", "                except UnicodeDecodeError as e:",
           "                except KeyError as e:",
           (RES + "test_shard_interactive_refuses_a_binary_input_file_after_the_lines_before",)),
    Mutant("model_build_oom_traceback", "out of host memory building the model: a paragraph naming the size",
           "shardtrain/core/host_oom.py", "        if found is None:", "        if True:",
           (RES + "test_out_of_host_memory_while_building_the_model_names_the_size",)),
    Mutant("dictionary_oom_traceback", "out of host memory loading the dictionary: a paragraph naming its size",
           "shardtrain/core/host_oom.py", "    except MemoryError:", "    except KeyError:",
           (RES + "test_out_of_host_memory_while_loading_the_dictionary_names_its_size",)),
    Mutant("no_memory_floor_before_torch", "a limit too low to import torch is refused before the import",
           "shardtrain/cli/entry.py", "    if too_low:", "    if False:",
           (RES + "test_an_address_space_too_small_to_import_torch_is_refused_before_the_import",)),
    Mutant("peer_lost_traceback", "a rank whose peer died says so in one paragraph and exits non-zero",
           "shardtrain/trainer/launch/peer_lost.py", "        if isinstance(error, RuntimeError) and _PEER_GONE",
           "        if False and _PEER_GONE",
           ("tests/trainer/launch/test_peer_lost.py::"
            "test_the_surviving_rank_says_its_peer_stopped_and_exits_non_zero",)),
    Mutant("plan_traces_every_rank", "shard-plan's cost does not grow with the world size",
           "shardtrain/plan/many_ranks.py", "    if world_size <= TRACE_RANKS:", "    if True:",
           (WORLD + "test_the_trace_runs_on_as_many_fake_ranks_for_16384_as_for_1024",)),
    Mutant("plan_many_ranks_unscaled", "a trace on fewer ranks is scaled to one rank of the run",
           "shardtrain/plan/many_ranks.py", "    if large.traced_shards == large.shards:", "    if True:",
           (WORLD + "test_a_scaled_trace_holds_what_fsdp2_gives_one_rank",
            WORLD + "test_combine_fits_the_shards_and_scales_the_wholes")),
    Mutant("plan_padding_ignored", "each rank's shard is ceil(rows / ranks) rows (FSDP2 pads)",
           "shardtrain/plan/many_ranks.py", "math.ceil(r / shards) * size", "r / shards * size",
           (WORLD + "test_a_scaled_trace_holds_what_fsdp2_gives_one_rank",
            WORLD + "test_combine_fits_the_shards_and_scales_the_wholes")),
    Mutant("requeue_missing_scontrol_exits_0", "a requeue without scontrol exits non-zero with the command to run",
           "shardtrain/trainer/launch/preemption.py",
           '        raise RequeueFailed(_not_requeued(job, "scontrol is not on PATH", command))',
           "        return False",
           (PRE + "test_a_requeue_that_does_not_happen_is_an_error_naming_the_command",)),
    Mutant("requeue_failing_scontrol_exits_0", "a failed scontrol requeue exits non-zero after the save",
           "shardtrain/trainer/launch/preemption.py", "        raise RequeueFailed(_not_requeued(job, why, command))",
           "        return False",
           (PRE + "test_a_requeue_that_does_not_happen_is_an_error_naming_the_command",
            PRE + "test_a_failed_requeue_exits_non_zero_after_saving")),
    Mutant("plot_nan_panel_silent", "shard-plot says which panel it leaves out for nan/inf values",
           "shardtrain/cli/plot.py",
           "    for note in no_training_notes(args.runs, runs) + nonfinite_notes(runs, metrics, args.metrics):",
           "    for note in no_training_notes(args.runs, runs):",
           (NAN + "test_an_all_nan_panel_is_left_out_with_a_note",
            NAN + "test_a_run_whose_curve_is_all_nan_is_named_in_the_panel_others_fill")),
]
