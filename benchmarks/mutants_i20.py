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
    Mutant("restart_keys_shared", "a torchrun restart's group keeps its store keys apart from the dead attempt's",
           "shardtrain/trainer/launch/rendezvous.py", 'return dist.PrefixStore(f"shardtrain/attempt{attempt}", store)',
           "return store", ("tests/distributed_launch/test_torchrun_restart.py::"
                            "test_a_killed_rank_is_restarted_by_torchrun_and_resumes_exactly",)),
    Mutant("spike_window_not_recorded", "a rollback records the window it skipped (what --skip-batches replays)",
           GUARD, "        self.skipped.append(window)", "        pass", (EXACT,)),
    Mutant("skip_batches_ignored", "--skip-batches passes over its windows",
           "shardtrain/data/batch_windows.py", "return any(e == epoch and a <= last and first <= b",
           "return False and any(e == epoch and a <= last and first <= b",
           (SPIKE + "test_skip_batches_equals_skipping_those_updates",)),
    Mutant("skip_batches_off_by_one", "--skip-batches' windows are inclusive at both ends",
           "shardtrain/data/batch_windows.py", "return any(e == epoch and a <= last and first <= b",
           "return any(e == epoch and a <= last and first < b",
           (SPIKE + "test_skip_batches_equals_skipping_those_updates",)),
    Mutant("spike_gnorm_rule_off", "--spike-gnorm-factor judges the gradient norm",
           GUARD, "if o.spike_gnorm_factor > 0:", "if False:",
           (SPIKE + "test_the_gradient_norm_rule_and_the_lr_scale",)),
    Mutant("spike_lr_scale_not_applied", "a rollback scales the learning rate by --spike-lr-scale",
           GUARD, "            trainer.lr_scheduler.set_lr_scale(self.lr_scale)", "            pass",
           (SPIKE + "test_the_gradient_norm_rule_and_the_lr_scale",)),
    Mutant("lr_scale_not_saved", "a checkpoint keeps the learning-rate scale",
           "shardtrain/optim/lr_scheduler/base.py", 'state_attrs: Tuple[str, ...] = ("best", "lr_scale")',
           'state_attrs: Tuple[str, ...] = ("best",)',
           (SPIKE + "test_a_sharded_checkpoint_after_a_rollback_resumes_exactly",)),
    Mutant("slurm_not_requeued", "SIGUSR1 under SLURM requeues the job once checkpoint_last is saved",
           "shardtrain/trainer/loop.py", "    if run.stopped_by_signal and ctx.is_master:", "    if False:",
           ("tests/cli/test_preemption.py::test_signal_saves_and_exits_zero_then_resumes",)),
    Mutant("spike_no_epoch_snapshot", "a rollback never reaches back into the previous epoch",
           GUARD, "if self.snapshot is None or self.snapshot.position[0] != epoch:", "if self.snapshot is None:",
           (SPIKE + "test_a_rollback_never_reaches_back_into_the_previous_epoch",)),
]
