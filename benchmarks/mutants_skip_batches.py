"""Mutants of --skip-batches (shardtrain/data/batch_windows.py and the loop): applied, inclusive at both ends, with
--update-freq above 1 passes over exactly the batches named, and windows that match nothing (or an epoch left
with nothing to train) are named. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

LOOP = "shardtrain/trainer/loop.py"
WINDOWS = "shardtrain/data/batch_windows.py"
SKIP = "tests/trainer/test_skip_batches.py::"
EXACT = SKIP + "test_update_freq_2_passes_over_exactly_the_batches_named"
SPIKE = "tests/trainer/test_spike_rollback.py::"

MUTANTS = [
    Mutant("skip_whole_update", "an update a window covers in part trains on its other batches",
           LOOP, "samples = [sample for batch, sample in enumerate(samples, first) if batch not in skipped]",
           "samples = []", (EXACT,)),
    Mutant("skip_batches_misnumbered", "an update's batches are numbered from the epoch's start",
           LOOP, "first = position - len(samples) + 1", "first = position - len(samples)", (EXACT,)),
    Mutant("skip_window_past_epoch_silent", "a window past its epoch's end is named in a warning",
           WINDOWS, "if missed:", "if False:", (SKIP + "test_a_window_past_the_epochs_end_is_named",)),
    Mutant("skip_empty_epoch_silent", "an epoch --skip-batches left with nothing to train is named",
           WINDOWS, "if self._epoch_batches and self._epoch_skipped == self._epoch_batches:", "if False:",
           (SKIP + "test_an_epoch_skipped_whole_and_a_window_never_reached_are_named",)),
    Mutant("skip_unreached_window_silent", "a window training never reached is named at the end of the run",
           LOOP, "for warning in run.skip_batches.end_run(run.trainer.num_updates):", "for warning in []:",
           (SKIP + "test_an_epoch_skipped_whole_and_a_window_never_reached_are_named",
            SKIP + "test_a_window_after_where_training_stopped_is_named_as_not_reached")),
    Mutant("skip_matched_window_named", "a window that matched a batch is no warning",
           WINDOWS, "self._settled.update(w for w in self.windows if w[0] == epoch and w[1] <= last and first <= w[2])",
           "pass", (SKIP + "test_a_window_past_the_epochs_end_is_named",)),
    Mutant("skip_window_before_resume_named", "a window before where a resumed run began is no warning",
           WINDOWS, "w[0] < epoch or (w[0] == epoch and w[2] <= start)", "w[0] < epoch",
           (SKIP + "test_the_windows_decisions",)),
    Mutant("skip_mid_epoch_stop_called_epoch_end", "a run stopped mid-epoch names its later windows as not reached",
           LOOP, "if not itr.has_next() else []:", "if True else []:",
           (SKIP + "test_a_window_after_where_training_stopped_is_named_as_not_reached",)),
    Mutant("skip_batches_ignored", "--skip-batches passes over its windows",
           "shardtrain/data/batch_windows.py", "return any(e == epoch and a <= last and first <= b",
           "return False and any(e == epoch and a <= last and first <= b",
           (SPIKE + "test_skip_batches_equals_skipping_those_updates",)),
    Mutant("skip_batches_off_by_one", "--skip-batches' windows are inclusive at both ends",
           "shardtrain/data/batch_windows.py", "return any(e == epoch and a <= last and first <= b",
           "return any(e == epoch and a <= last and first < b",
           (SPIKE + "test_skip_batches_equals_skipping_those_updates",)),
]
