"""Mutants of --spike-rollback (shardtrain/trainer/spike.py): the snapshot restored and checkpointed, and its rule,
histories and counting, by value (tests/trainer/test_spike_rule.py), and the rollback that waits for an
--async-save's write of the live tensors. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

GUARD = "shardtrain/trainer/spike.py"
RULE = "tests/trainer/test_spike_rule.py::"
FILL = RULE + "test_nothing_but_nan_is_judged_until_the_window_is_full"
MEDIAN = RULE + "test_the_median_of_exactly_the_last_window_values_and_the_factor_boundary"
HISTORIES = RULE + "test_after_a_rollback_the_histories_are_the_snapshots"
REPLAY = RULE + "test_a_rollback_leaves_the_histories_of_a_run_without_the_skipped_batches"
INSIDE = RULE + "test_two_spikes_inside_the_horizon_stop_the_run"
OUTSIDE = RULE + "test_a_spike_outside_the_horizon_is_counted_alone"
GNORM = RULE + "test_the_gradient_norm_rule_and_the_lr_scale_after_two_rollbacks"
SPIKE = "tests/trainer/test_spike_rollback.py::"
EXACT = SPIKE + "test_a_rolled_back_spike_ends_as_if_its_batches_were_never_there"

MUTANTS = [
    Mutant("spike_judged_before_window_full", "nothing but NaN/inf is judged until --spike-window values are in",
           GUARD, "if len(self.history) == self.history.maxlen:", "if self.history:", (FILL,)),
    Mutant("spike_median_low", "a spike is judged against the exact median (an even window's middle two averaged)",
           GUARD, "median = statistics.median(self.history)", "median = statistics.median_low(self.history)",
           (MEDIAN,)),
    Mutant("spike_factor_inclusive", "a value exactly --spike-factor x the median is no spike",
           GUARD, "if value > self.factor * median:", "if value >= self.factor * median:", (MEDIAN,)),
    Mutant("spike_joins_history", "a value judged a spike does not join the history",
           GUARD, "if value > self.factor * median:",
           "if value > self.factor * median and not self.history.append(value):", (MEDIAN,)),
    Mutant("spike_loss_not_the_mean", "the loss judged is the update's summed loss over its summed sample size",
           GUARD, 'return logs.get("loss", 0.0) / max(out["sample_size"], 1.0) / LN2',
           'return logs.get("loss", 0.0) / LN2',
           (RULE + "test_the_judged_loss_is_the_logged_sample_size_weighted_mean",
            RULE + "test_a_run_judges_the_loss_over_every_batch_and_rank_weighted_by_sample_size")),
    Mutant("spike_loss_in_nats", "the loss judged is the one the run logs (base 2)",
           GUARD, 'return logs.get("loss", 0.0) / max(out["sample_size"], 1.0) / LN2',
           'return logs.get("loss", 0.0) / max(out["sample_size"], 1.0)',
           (RULE + "test_the_judged_loss_is_the_logged_sample_size_weighted_mean",)),
    Mutant("spike_old_histories_not_converted", "a checkpoint's histories in nats (before base 2) load converted",
           GUARD, 'if state.get("loss_base") != 2 and histories:', "if False:",
           (RULE + "test_histories_saved_in_nats_load_in_base_2",)),
    Mutant("spike_histories_not_restored", "a rollback puts back the rule histories of its snapshot",
           GUARD, "for rule, history in zip(self.rules, snapshot.histories):", "for rule, history in []:",
           (HISTORIES, REPLAY)),
    Mutant("spike_snapshot_without_histories", "a snapshot keeps the rule histories as they are then",
           GUARD, "histories = [list(rule.history) for rule in self.rules]", "histories = [[] for rule in self.rules]",
           (HISTORIES,)),
    Mutant("spike_horizon_off_by_one", "a rollback horizon updates back no longer counts",
           GUARD, "if u > update - self.horizon]", "if u >= update - self.horizon]", (OUTSIDE,)),
    Mutant("spike_counts_only_the_last", "rollbacks within the horizon are counted together",
           GUARD, "self.rollbacks = [u for u in self.rollbacks if u > update - self.horizon] + [update]",
           "self.rollbacks = [update]", (INSIDE,)),
    Mutant("spike_horizon_fixed", "the horizon is 10 x --spike-window updates",
           GUARD, "self.horizon = 10 * o.spike_window", "self.horizon = 10 * 50", (INSIDE, OUTSIDE)),
    Mutant("spike_overflow_gnorm_judged", "an fp16 overflow's gradient norm is no spike and does not join",
           GUARD, 'if rule.what == "loss" or out["stepped"]]', "if True]", (GNORM,)),
    Mutant("spike_lr_scale_not_compounded", "each rollback multiplies the lr by --spike-lr-scale again",
           GUARD, "scale = trainer.lr_scheduler.lr_scale * self.lr_factor", "scale = self.lr_factor", (GNORM,)),
    Mutant("spike_interval_ignored", "snapshots are --spike-snapshot-interval updates apart",
           GUARD, "trainer.num_updates % self.interval == 0", "trainer.num_updates % 20 == 0",
           (RULE + "test_the_snapshot_interval_sets_where_a_rollback_lands",)),
    Mutant("spike_restore_races_async_save", "a rollback waits for an --async-save's write of the live tensors",
           GUARD, "if wait_for_live_writes():", "if False:",
           (RULE + "test_a_rollback_restores_only_after_a_background_write_of_the_live_tensors_landed",
            "tests/trainer/checkpoint/test_async_save_rollback.py::"
            "test_a_rollback_during_an_async_write_leaves_the_checkpoint_whole")),
    Mutant("spike_guard_not_saved", "a checkpoint keeps the guard's history and rollbacks",
           "shardtrain/trainer/checkpoint/contents.py",
           '**({"spike_guard": spikes} if spikes is not None else {})}', "}",
           (SPIKE + "test_a_sharded_checkpoint_after_a_rollback_resumes_exactly",)),
    Mutant("spike_rng_not_restored", "a rollback restores the random generators (dropout draws as before)",
           GUARD, "        set_rng_state(self.rng)", "        pass", (EXACT,)),
    Mutant("spike_optimizer_not_restored", "a rollback restores the optimizer state, DTensor shards included",
           GUARD, "                    _local(live[key]).copy_(value)", "                    pass", (EXACT,)),
    Mutant("spike_schedule_not_restored", "a rollback restores the lr schedule, loss scale and update count",
           GUARD, "            part.load_state_dict(_copy(self.parts[name]))", "            pass", (EXACT,)),
    Mutant("spike_max_rollbacks_ignored", "too many rollbacks stop the run",
           GUARD, "if len(self.rollbacks) > self.max_rollbacks:", "if False:",
           (SPIKE + "test_too_many_rollbacks_stop_the_run",)),
    Mutant("spike_window_not_recorded", "a rollback records the window it skipped (what --skip-batches replays)",
           GUARD, "        self.skipped.append(window)", "        pass", (EXACT,)),
    Mutant("spike_gnorm_rule_off", "--spike-gnorm-factor judges the gradient norm",
           GUARD, "if o.spike_gnorm_factor > 0:", "if False:",
           (SPIKE + "test_the_gradient_norm_rule_and_the_lr_scale",)),
    Mutant("spike_lr_scale_not_applied", "a rollback scales the learning rate by --spike-lr-scale",
           GUARD, "        trainer.lr_scheduler.set_lr_scale(scale)", "        pass",
           (SPIKE + "test_the_gradient_norm_rule_and_the_lr_scale",)),
    Mutant("spike_no_epoch_snapshot", "a rollback never reaches back into the previous epoch",
           GUARD, "if self.snapshot is None or self.snapshot.position[0] != epoch:", "if self.snapshot is None:",
           (SPIKE + "test_a_rollback_never_reaches_back_into_the_previous_epoch",)),
]
