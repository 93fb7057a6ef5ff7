"""Mutants of shardtrain/trainer/memory/ (one rank's memory, estimated once for the fit check and shard-plan) and
of the one config-with-overrides helper they and the planner use. Each mutant was seen to fail its tests; the
mutants of the estimator's older claims stay in mutants_plan*.py, mutants_run_devices.py and mutants_integrity.py."""
from mutant_spec import Mutant

RANK = "shardtrain/trainer/memory/rank_memory.py"
ASYNC = "tests/trainer/test_async_save_memory.py::"
DECISIONS = "tests/plan/test_plan_decisions.py::"

MUTANTS = [
    Mutant("overrides_change_the_original", "a config with overrides is a copy; the config it came from stays",
           "shardtrain/config/overridden.py", "    cfg = cfg.copy()\n", "",
           ("tests/config/test_overridden.py::test_the_copy_holds_the_overrides_and_the_original_is_left_as_it_was",)),
    Mutant("fit_check_without_gradient_copies", "the fit check counts the backend's gradient copies, as shard-plan",
           RANK, "    extra = gradient_copy_bytes(facts, grads, params + optimizer + master + buffers + grads, peak)\n",
           "    extra = gradient_copy_bytes(facts, grads, params + optimizer + master + buffers + grads, peak) "
           "if \"temporaries\" in kinds else 0\n",
           (ASYNC + "test_the_memory_check_counts_the_backends_gradient_copies_as_shard_plan_does",)),
    Mutant("offloaded_grads_counted_at_the_gpus_peak", "the host holds all the offloaded gradients once backward ends",
           RANK, '"grads": self.grads if offloaded else self.grads_at_peak,', '"grads": self.grads_at_peak,',
           (DECISIONS + "test_a_gpu_run_keeps_offloaded_shards_and_cpu_optimizer_state_on_the_host",)),
]

# -- issue 45, items 2.6/4.2: what the CPU step and torch's pinned allocator add --------------------------------------
COPIES = "tests/trainer/test_step_copies_and_pinned_memory.py::"
PINNED = "shardtrain/trainer/memory/pinned.py"
MUTANTS += [
    Mutant("undo_copies_not_counted", "the step during backward's undo copies are counted (12 B a parameter)",
           RANK, "    if not facts.keeps_undo_copies(device_type):\n", "    if True:\n",
           (COPIES + "test_clipping_or_fp16_adds_the_undo_copies_of_each_shard",
            COPIES + "test_shard_plan_counts_the_undo_copies_too",
            COPIES + "test_the_fit_check_refuses_what_the_old_count_let_through",
            COPIES + "test_the_runs_own_check_refuses_the_copies_on_a_cpu_run")),
    Mutant("undo_copies_not_under_fp16", "fp16's overflow may undo an update: its copies are kept",
           "shardtrain/trainer/run_facts.py",
           "    return cfg.optimization.clip_norm > 0 or skip_nan(cfg) > 0 or chosen(cfg.common).loss_scaled\n",
           "    return cfg.optimization.clip_norm > 0 or skip_nan(cfg) > 0\n",
           (COPIES + "test_clipping_or_fp16_adds_the_undo_copies_of_each_shard",)),
    Mutant("undo_copies_on_the_gpu", "the undo copies and pinned blocks are host memory",
           RANK, '"undo": True, "pinned": True, ', "",
           (COPIES + "test_clipping_or_fp16_adds_the_undo_copies_of_each_shard",
            COPIES + "test_pinned_blocks_are_rounded_up_to_powers_of_two")),
    Mutant("pinned_blocks_not_rounded", "pinned blocks are rounded up to powers of two",
           PINNED, "    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()\n", "    return max(nbytes, 0)\n",
           (COPIES + "test_pinned_blocks_are_rounded_up_to_powers_of_two",)),
    Mutant("pinned_gradients_despite_the_hook", "stepping during backward, FSDP2 copies gradients into pageable memory",
           PINNED, "    return 1 if facts.steps_during_backward(device_type) else 2\n", "    return 2\n",
           (COPIES + "test_pinned_blocks_are_rounded_up_to_powers_of_two",)),
    Mutant("fit_check_without_pinned_rounding", "the fit check counts the pinned rounding",
           "shardtrain/trainer/memory/fit.py",
           '    kinds["pinned"] = pinned_rounding(cfg, components, task, facts, device_type)\n', "",
           (COPIES + "test_pinned_blocks_are_rounded_up_to_powers_of_two",
            COPIES + "test_the_fit_check_refuses_what_the_old_count_let_through")),
    Mutant("after_backward_not_named_first", "the refusal names --cpu-step after-backward first where it alone fits",
           "shardtrain/trainer/memory/fit.py", "    alone = need - ranks * (est.undo - est.pinned) <= free\n",
           "    alone = False\n",
           (COPIES + "test_the_fit_check_refuses_what_the_old_count_let_through",
            COPIES + "test_the_runs_own_check_refuses_the_copies_on_a_cpu_run")),
]
MUTANTS += [
    Mutant("run_fit_check_bf16_as_fp32", "the run's own fit check counts activations in the compute dtype's bytes",
           "shardtrain/trainer/memory/fit.py",
           "compute_bytes=facts.dtypes.compute.itemsize if facts.dtypes.compute else 4)", "compute_bytes=4)",
           ("tests/trainer/memory/test_memory_fit.py::test_the_runs_own_check_counts_bf16_activations_in_two_bytes",)),
    Mutant("async_save_stages_the_unsaved_optimizer_state",
           "--async-save --no-save-optimizer-state stages the parameters alone",
           "shardtrain/trainer/run_facts.py", 'return ("params",) if c.no_save_optimizer_state else SAVED_KINDS',
           "return SAVED_KINDS",
           (ASYNC + "test_without_the_optimizer_state_only_the_parameters_are_staged",)),
    Mutant("meta_sizes_ignore_the_tasks_batch", "the memory check's activations come from the task's own batch",
           "shardtrain/trainer/memory/model_sizes.py", "task.dummy_batch(1, length, device=\"meta\")",
           "type(task).__mro__[-2].dummy_batch(task, 1, length, device=\"meta\")",
           ("tests/trainer/memory/test_meta_sizes_task_batch.py",)),
]
