"""Mutants of the loop's steps after an update, by value without processes (tests/trainer/test_loop_steps.py):
the validate/save decision (shardtrain/trainer/validation.py ``due``), and the newest checkpoint checked
finite, kept by the checkpoint manager and named by a divergence. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

T = "shardtrain/trainer/"
STEPS = "tests/trainer/test_loop_steps.py::"
DUE = STEPS + "test_due_validates_and_saves_where_fairseq_does"

MUTANTS = [
    Mutant("stop_not_validated", "a run that stops validates there (once past --validate-after-updates)",
           T + "validation.py", "                    or stopping or on_valid_interval)",
           "                    or on_valid_interval)", (DUE,)),
    Mutant("divergence_names_no_checkpoint", "a divergence names the newest checkpoint this run checked finite",
           T + "loop.py", "        raise e.naming(run.checkpoints.last_checked_save) from None\n", "        raise\n",
           (STEPS + "test_a_divergence_names_the_managers_checked_save",)),
    Mutant("failed_save_counts_as_checked", "only a checkpoint saved (a failed save raised) is the newest checked one",
           T + "checkpoint/manager.py", "        try:\n            # the format prunes",
           '        self.last_checked_save = f"{names[0]} of update {updates}"\n        try:\n'
           "            # the format prunes",
           (STEPS + "test_the_manager_keeps_the_newest_checked_save",)),
]
