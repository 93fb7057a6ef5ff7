"""Issue 20: long runs that heal themselves. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

SPIKE = "tests/trainer/test_spike_rollback.py::"
EXACT = SPIKE + "test_a_rolled_back_spike_ends_as_if_its_batches_were_never_there"
GUARD = "shardtrain/trainer/spike.py"

MUTANTS = [
    Mutant("spike_rng_not_restored", "a rollback restores the random generators (dropout draws as before)",
           GUARD, "        set_rng_state(self.rng)", "        pass", (EXACT,)),
    Mutant("spike_optimizer_not_restored", "a rollback restores the optimizer state, DTensor shards included",
           GUARD, "                    _local(live[key]).copy_(value)", "                    pass", (EXACT,)),
    Mutant("spike_schedule_not_restored", "a rollback restores the lr schedule, loss scale and update count",
           GUARD, "            part.load_state_dict(_copy(self.parts[name]))", "            pass", (EXACT,)),
    Mutant("spike_guard_not_saved", "a checkpoint keeps the guard's history and rollbacks",
           "shardtrain/trainer/checkpoint/contents.py",
           '**({"spike_guard": run.spikes} if getattr(run, "spikes", None) is not None else {})}', "}",
           (SPIKE + "test_a_sharded_checkpoint_after_a_rollback_resumes_exactly",)),
    Mutant("spike_max_rollbacks_ignored", "too many rollbacks stop the run",
           GUARD, "if len(self.rollbacks) > self.max_rollbacks:", "if False:",
           (SPIKE + "test_too_many_rollbacks_stop_the_run",)),
]
