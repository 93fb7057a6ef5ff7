"""Mutants of stepping each shard during backward (fully_sharded + cpu_adam): shardtrain/trainer/parallel/
step_in_backward.py, CPUAdam.step_one/restore, and where the trainer arms, commits and undoes it. Each mutant was
seen to fail its tests."""
from mutant_spec import T, Mutant

SIB = T + "parallel/step_in_backward.py"
ADAM = "shardtrain/optim/cpu_adam.py"
F = "tests/trainer/parallel/test_step_in_backward.py::"
# The 2-rank spawn (every case runs in it, whichever case a node id names)
U = "tests/trainer/parallel/test_step_in_backward_units.py::"
SAME = F + "test_stepping_during_backward_equals_stepping_after_it_bit_for_bit"

MUTANTS = [
    Mutant("sib_commit_skips_unhanded_shards", "a shard no hook handed over still steps when the update commits",
           SIB, "                    self.optimizer.step_one(p, multiplier, False)\n",
           "                    pass\n",
           (U + "test_commit_steps_the_shards_no_hook_handed_over",)),
    Mutant("sib_restore_keeps_moments", "an undone update leaves Adam's moments as they were",
           ADAM, "            target.copy_(value)\n", "            pass\n",
           (U + "test_restore_undoes_step_one_exactly_and_a_first_step_leaves_no_state",
            U + "test_undo_restores_every_shard_stepped_during_backward", SAME + "[fp32_clipped]")),
    Mutant("sib_step_one_multiplies_the_gradient", "stepping during backward leaves the gradients for the norm",
           ADAM, "            grad = self._grad_copy(grad)\n", "            pass\n",
           (U + "test_step_one_leaves_the_gradient_as_it_was", SAME + "[fp32_clipped]")),
    Mutant("sib_keep_never", "clipping, fp16 or --skip-nan-updates keep copies to undo from",
           SIB, "    keep = cfg.optimization.clip_norm > 0 or precision.may_skip()",
           "    keep = False",
           (F + "test_when_shards_step_during_backward_and_whether_copies_are_kept",)),
    Mutant("sib_fp16_may_not_skip", "fp16 keeps copies: an overflow undoes the update",
           T + "precision.py", "        return True  # an overflow skips the update",
           "        return False  # an overflow skips the update",
           (F + "test_when_shards_step_during_backward_and_whether_copies_are_kept",
            SAME + "[fp16_overflow]")),
    Mutant("sib_armed_from_the_first_micro_batch", "--update-freq: only the last micro-batch's gradients step",
           T + "trainer.py", "                if last and overlap is not None:\n",
           "                if i == 0 and overlap is not None:\n",
           (SAME + "[update_freq_2]",)),
    Mutant("sib_hooks_stay_armed", "hooks of an earlier micro-batch are ignored, also after the first update",
           SIB, "        self._worker, self._multiplier = None, None\n", "        self._worker = None\n",
           (U + "test_only_the_last_micro_batch_steps",)),
    Mutant("sib_finish_swallows_worker_error", "an error in the worker stops the update on the training thread",
           SIB, "            raise error\n", "            return\n",
           (U + "test_an_error_in_the_worker_is_raised_by_finish_on_the_training_thread",)),
    Mutant("sib_restore_keeps_fresh_state", "undoing a first step removes the state it created",
           ADAM, "            del self.state[p]\n            return\n", "            return\n",
           (U + "test_restore_undoes_step_one_exactly_and_a_first_step_leaves_no_state",)),
    Mutant("sib_commits_when_clipped", "a clipped update steps with the clipped gradient",
           T + "trainer.py", "if self.step_in_backward is not None and not clipped:",
           "if self.step_in_backward is not None:",
           (SAME + "[fp32_clipped]",)),
    Mutant("sib_skipped_update_not_undone", "a skipped update (fp16 overflow, --skip-nan-updates) leaves no trace",
           T + "trainer.py", "        elif self.step_in_backward is not None:\n            self.step_in_backward.undo()",
           "        elif self.step_in_backward is not None:\n            pass",
           (SAME + "[skip_nan_updates_2]",)),
    Mutant("sib_abandon_keeps_steps", "an error in backward leaves the shards as they were",
           SIB, "            if self.keep:\n                self.undo()\n            self._stepped",
           "            self._stepped",
           (F + "test_an_error_in_backward_undoes_the_shards_already_stepped",)),
    Mutant("sib_falls_back_after_backward", "shards step during backward, not after it (the same bits)",
           SIB, "        self._queue.put((p, event))\n", "        pass\n",
           (F + "test_shards_step_while_earlier_blocks_are_still_in_backward", SAME + "[fp32_clipped]")),
    Mutant("sib_flag_ignored", "--cpu-step-after-backward steps after backward",
           SIB, "    if cfg.distributed.cpu_step_after_backward:\n", "    if False:\n",
           (F + "test_cpu_step_after_backward_steps_after_the_last_backward",)),
    Mutant("sib_stale_group_after_load", "a step during backward reads the lr of the groups a loaded state brings",
           "shardtrain/optim/cpu_adam.py", "        if group is None or not any(group is g for g in self.param_groups):",
           "        if group is None:",
           (U + "test_step_one_follows_the_groups_a_loaded_state_brings",)),
    Mutant("sib_grad_copy_shares_a_stale_size", "each shard's gradient copy is its own, whatever the sizes before",
           ADAM, "        if buffer is None or buffer.numel() < grad.numel():", "        if buffer is None:",
           (U + "test_step_one_steps_a_larger_gradient_after_a_smaller_one_as_step_does",)),
]
