"""Mutants of where an update's time goes under offload (shardtrain/trainer/offload_times.py, the worker's and the
trainer's stretches, the record fields). Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

TIMES = T + "offload_times.py"
F = "tests/trainer/test_offload_times.py::"
SPLIT = F + "test_the_split_from_written_down_stretches"
DURING = F + "test_every_record_splits_the_update_and_the_step_hides_under_backward"
AFTER = F + "test_stepping_after_backward_hides_nothing"
UPLOAD = F + "test_upload_is_the_time_in_fsdps_pre_forward_unshards"

MUTANTS = [
    Mutant("times_worker_work_uncounted", "the worker's steps count as CPU optimizer work under backward",
           T + "parallel/step_in_backward.py", "            self.clock.worked(start, time.perf_counter())",
           "            pass", (DURING,)),
    Mutant("times_hidden_counts_work_after_backward", "only the work done before backward's end is hidden",
           TIMES, "max(0.0, min(b, self._backward_done) - a)", "(b - a)", (SPLIT, AFTER)),
    Mutant("times_training_thread_step_uncounted", "the step after backward counts as CPU optimizer work",
           T + "optimizer_step.py", "        return self.times.stepping()", "        return contextlib.nullcontext()",
           (AFTER,)),
    Mutant("times_record_without_split", "each record carries the split",
           T + "metrics/run_metrics.py", "            for key, value in out.get(\"offload\", {}).items():",
           "            for key, value in {}.items():", (DURING,)),
    Mutant("times_upload_after_fsdps_hook", "the upload is timed from before FSDP2's pre-forward hook",
           TIMES, "register_forward_pre_hook(self._start, prepend=True)", "register_forward_pre_hook(self._start)",
           (UPLOAD,)),
    Mutant("times_wait_uncounted", "waits for gradients are their own field", TIMES,
           "            self.waiting += seconds", "            pass", (SPLIT,)),
    Mutant("times_not_reset_per_update", "each update's split is its own", TIMES,
           "        self.clock.take()  # nothing from before this update", "        pass", (SPLIT,)),
    Mutant("times_upload_not_reset_per_update", "each update's upload is its own", TIMES,
           "        self.unshards.seconds = 0.0\n", "", (SPLIT,)),
    Mutant("times_hooks_outlive_the_trainer", "closing the trainer removes its hooks from the model",
           T + "trainer.py", "        self.optimizer_step.close()\n", "        pass\n",
           (F + "test_closing_the_trainer_removes_its_hooks",)),
]
