"""Mutants of issue 31's records after a resume, the --log-file under any console format, and Ctrl-C.
Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

REC = "tests/trainer/checkpoint/test_resume_records.py::"
PROG = "tests/trainer/metrics/test_log_progress.py::"
CTRL_C = "tests/trainer/launch/test_ctrl_c.py::"

MUTANTS = [
    Mutant("epoch_record_holds_the_previous_epoch", "an epoch's train record covers that epoch only after a resume",
           "shardtrain/trainer/loop.py", "    if itr.n == 0:\n        # An epoch's record", "    if False:\n"
           "        # An epoch's record", (REC + "test_train_records_after_every_kind_of_resume",)),
    Mutant("mid_epoch_resume_drops_restored_meters", "a mid-epoch resume's epoch record covers the whole epoch",
           "shardtrain/trainer/loop.py", "    if itr.n == 0:\n        # An epoch's record", "    if True:\n"
           "        # An epoch's record", (REC + "test_train_records_after_every_kind_of_resume",)),
    Mutant("tensorboard_steps_written_twice", "TensorBoard steps are not written twice after a resume",
           "shardtrain/trainer/metrics/tensorboard.py", "purge_step=self._purge_step)", "purge_step=None)",
           (REC + "test_train_records_after_every_kind_of_resume",)),
    Mutant("tqdm_log_file_without_interval_records", "the --log-file holds train_inner records under tqdm",
           "shardtrain/trainer/metrics/progress.py",
           "        JsonBar._log_line(self, stats, tag, only=FILE)\n\n    def _print_line(self, stats, tag):\n"
           "        _emit(tag, _pipes(self.prefix, stats), only=CONSOLE)",
           "        pass\n\n    def _print_line(self, stats, tag):\n        _emit(tag, _pipes(self.prefix, stats), only=CONSOLE)",
           (REC + "test_the_log_file_holds_the_records_whatever_the_console_format", PROG
            + "test_tqdm_bar_postfix_and_summary")),
    Mutant("file_only_records_on_the_console", "under tqdm the console shows a bar, not json lines",
           "shardtrain/trainer/metrics/logging_setup.py",
           "        if getattr(record, ONLY, CONSOLE) != CONSOLE:\n            return\n", "",
           (REC + "test_the_log_file_holds_the_records_whatever_the_console_format",)),
    Mutant("ctrl_c_saves_nothing", "the first Ctrl-C finishes the update and saves checkpoint_last",
           "shardtrain/trainer/launch/preemption.py",
           "            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._own_interrupt if led else\n"
           "                                                          self._interrupt)\n", "",
           (CTRL_C + "test_the_first_ctrl_c_finishes_the_update_and_saves",)),
    Mutant("launcher_passes_on_the_first_ctrl_c_as_sigint", "a terminal's first Ctrl-C saves on 2 ranks",
           "shardtrain/trainer/launch/preemption.py", "forward(signum, frame, as_signal=PASSED_ON)",
           "forward(signum, frame)", (CTRL_C + "test_the_first_ctrl_c_finishes_the_update_and_saves",)),
    Mutant("second_ctrl_c_waits_for_the_save", "a second Ctrl-C stops at once",
           "shardtrain/trainer/launch/preemption.py", "            self._stopping_now = True\n"
           "            raise KeyboardInterrupt\n", "            return\n",
           (CTRL_C + "test_the_watcher_stops_at_once_on_a_second_ctrl_c_and_once_only", CTRL_C
            + "test_a_second_ctrl_c_stops_at_once")),
]
