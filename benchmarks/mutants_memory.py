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
