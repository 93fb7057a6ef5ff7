"""Mutants of stepping each shard during backward (fully_sharded + cpu_adam): shardtrain/trainer/parallel/
step_in_backward.py, CPUAdam.step_one/restore, and where the trainer arms, commits and undoes it. Each mutant was
seen to fail its tests."""
from mutant_spec import T, Mutant

SIB = T + "parallel/step_in_backward.py"
STEP = T + "optimizer_step.py"
FACTS = T + "run_facts.py"
DECISION = "tests/trainer/test_cpu_step_decision.py::test_the_decision_for_each_condition"
REFUSED = "tests/trainer/test_cpu_step_decision.py::test_during_backward_asked_for_where_it_cannot_apply_is_refused"
REFUSED_CLI = "tests/trainer/test_cpu_step_decision.py::test_shard_train_refuses_it_in_one_paragraph_and_writes_nothing"
ADAM = "shardtrain/optim/cpu_adam.py"
F = "tests/trainer/parallel/test_step_in_backward.py::"
# The 2-rank spawn (every case runs in it, whichever case a node id names)
U = "tests/trainer/parallel/test_step_in_backward_units.py::"
SAME = F + "test_stepping_during_backward_equals_stepping_after_it_bit_for_bit"

MUTANTS = [
    Mutant("sib_commit_skips_unhanded_shards", "a shard no hook handed over still steps when the update commits",
           SIB, "                    self.optimizer.step_one(p, multiplier, False, leave_grad=False)\n",
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
           T + "precision/fp16.py", "        return True  # an overflow skips the update",
           "        return False  # an overflow skips the update",
           (F + "test_when_shards_step_during_backward_and_whether_copies_are_kept",
            SAME + "[fp16_overflow]")),
    Mutant("sib_armed_from_the_first_micro_batch", "--update-freq: only the last micro-batch's gradients step",
           T + "trainer.py", "                if last:\n                    self.optimizer_step.last_backward(",
           "                if i == 0:\n                    self.optimizer_step.last_backward(",
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
           STEP, "        if not clipped:\n            self.step_in_backward.commit(multiplier)",
           "        if True:\n            self.step_in_backward.commit(multiplier)",
           (SAME + "[fp32_clipped]",)),
    Mutant("sib_skipped_update_not_undone", "a skipped update (fp16 overflow, --skip-nan-updates) leaves no trace",
           STEP, "        self.step_in_backward.undo()  # a skipped update leaves no trace",
           "        pass",
           (SAME + "[skip_nan_updates_2]",)),
    Mutant("sib_abandon_keeps_steps", "an error in backward leaves the shards as they were",
           SIB, "            if self.keep:\n                self.undo()\n            self._forget()",
           "            self._forget()",
           (F + "test_an_error_in_backward_undoes_the_shards_already_stepped",)),
    Mutant("sib_falls_back_after_backward", "shards step during backward, not after it (the same bits)",
           SIB, "        self._queue.put((p, event))\n", "        pass\n",
           (F + "test_shards_step_while_earlier_blocks_are_still_in_backward", SAME + "[fp32_clipped]")),
    Mutant("sib_flag_ignored", "--cpu-step after-backward steps after backward",
           FACTS, "        if why is None and self.distributed.cpu_step == \"after-backward\":",
           "        if False:",
           (F + "test_cpu_step_after_backward_steps_after_the_last_backward",)),
    Mutant("sib_stale_group_after_load", "a step during backward reads the lr of the groups a loaded state brings",
           "shardtrain/optim/cpu_adam.py", "        if group is None or not any(group is g for g in self.param_groups):",
           "        if group is None:",
           (U + "test_step_one_follows_the_groups_a_loaded_state_brings",)),
    Mutant("sib_grad_copy_shares_a_stale_size", "each shard's gradient copy is its own, whatever the sizes before",
           ADAM, "        if buffer is None or buffer.numel() < grad.numel():", "        if buffer is None:",
           (U + "test_step_one_steps_a_larger_gradient_after_a_smaller_one_as_step_does",)),
    Mutant("sib_norm_after_the_step", "each shard's norm is taken before the kernel writes its gradient back",
           SIB, "        for p, norm in zip(params, local_norms(grads)):  # before the kernel writes the gradients back\n"
           "            self._norms[p] = norm\n"
           "        for p in params:\n"
           "            kept = self.optimizer.step_one(p, self._multiplier, self.keep, leave_grad=self.keep)\n",
           "        for p in params:\n"
           "            kept = self.optimizer.step_one(p, self._multiplier, self.keep, leave_grad=self.keep)\n"
           "            self._norms[p] = _shard_norm(p)\n",
           (U + "test_the_norm_is_taken_before_stepping_and_only_what_may_be_undone_copies_the_gradient",
            SAME + "[update_freq_2]")),
    Mutant("sib_norm_of_written_back_gradients", "the trainer takes the norm the worker took, not the backend's",
           STEP, "        return self.step_in_backward.grad_norm()  # its worker",
           "        return self.backend.grad_norm(self.params)  # its worker",
           (SAME + "[update_freq_2]",)),
    Mutant("sib_norm_reduced_once_after_stacking", "the per-shard norms reduce as get_total_norm over DTensors does",
           "shardtrain/core/torch_private.py",
           "    partials = [dtensor_where_it_is(n, like.device_mesh, placements, n.shape) for n in local_norms]\n"
           "    total = torch.linalg.vector_norm(torch.stack(partials), 2.0)\n",
           "    local = torch.linalg.vector_norm(torch.stack(local_norms), 2.0)\n"
           "    total = dtensor_where_it_is(local, like.device_mesh, placements, local.shape)\n",
           (SAME + "[fp32_clipped]",)),
    Mutant("sib_redo_steps_the_written_back_gradient", "copies are kept, the gradient is stepped from a copy",
           SIB, "self.keep, leave_grad=self.keep)", "self.keep, leave_grad=False)",
           (U + "test_the_norm_is_taken_before_stepping_and_only_what_may_be_undone_copies_the_gradient",
            SAME + "[fp32_clipped]")),
    Mutant("sib_copies_the_gradient_without_keep", "without copies to undo from, no gradient is copied either",
           SIB, "self.keep, leave_grad=self.keep)", "self.keep, leave_grad=True)",
           (U + "test_the_norm_is_taken_before_stepping_and_only_what_may_be_undone_copies_the_gradient",)),
    Mutant("sib_auto_during_on_a_cpu_run", "--cpu-step auto: after backward on a CPU run (the same cores)",
           FACTS, "        if why is None and self.distributed.cpu_step == \"auto\" and device == \"cpu\":",
           "        if False:",
           (F + "test_when_shards_step_during_backward_and_whether_copies_are_kept",)),
    Mutant("sib_auto_after_on_an_accelerator", "--cpu-step auto: during backward where the model is on an accelerator",
           FACTS, "        if why is None and self.distributed.cpu_step == \"auto\" and device == \"cpu\":",
           "        if why is None and self.distributed.cpu_step == \"auto\":", (DECISION,)),
    Mutant("sib_steps_during_an_async_write", "--async-save: the worker waits until the live state is written",
           SIB, "            if self.before_stepping is not None:\n                self.before_stepping()\n", "",
           ("tests/trainer/checkpoint/test_async_save_cpu.py::test_the_cpu_step_during_backward_waits_for_the_write_too",)),
    Mutant("sib_trainer_forgets_the_write", "the trainer's worker waits for --async-save's write",
           T + "trainer.py", "before_stepping=wait_for_live_writes)", "before_stepping=None)",
           ("tests/trainer/checkpoint/test_async_save_cpu.py::test_the_cpu_step_during_backward_waits_for_the_write_too",)),
    # the one decision (RunFacts.cpu_step_after_backward), its refusal (issue 45, 4.9) and the step chosen from it
    Mutant("cpu_step_during_backward_unsharded", "parameters that are not sharded step after backward",
           FACTS, "        if not self.backend.shards_parameters:\n            alone",
           "        if False:\n            alone", (DECISION,)),
    Mutant("cpu_step_during_backward_any_optimizer", "an optimizer stepping all parameters at once steps after "
           "backward", FACTS, "        if not getattr(self.spec.cls, \"steps_on_host\", False):\n            return (",
           "        if False:\n            return (", (DECISION,)),
    Mutant("cpu_step_during_backward_shards_on_the_gpu", "shards on the GPU step after backward",
           FACTS, "        if device != \"cpu\" and not self.state_on_host:", "        if False:", (DECISION,)),
    Mutant("cpu_step_during_backward_fp16_moments", "--fp16-adam-stats steps after backward (by the facts)",
           FACTS, "        if self.spec.kwargs.get(\"fp16_adam_stats\"):", "        if False:", (DECISION,)),
    Mutant("cpu_step_refusal_skipped", "an explicit --cpu-step during-backward it cannot follow is refused",
           T + "run.py", "        refuse_a_cpu_step_it_cannot_follow(facts, ctx.device.type)", "        pass",
           (REFUSED_CLI,)),
    Mutant("cpu_step_auto_refused", "--cpu-step auto is never refused: it steps after backward",
           FACTS, "    if facts.distributed.cpu_step == \"during-backward\" and why is not None:",
           "    if why is not None:", (REFUSED,)),
    Mutant("optimizer_step_untimed_under_offload", "an offloaded run's updates are timed, whatever its optimizer",
           STEP, "    if not (facts.steps_shards_on_host or facts.state_on_host):",
           "    if not facts.steps_shards_on_host:",
           ("tests/trainer/test_optimizer_step.py::test_the_step_is_chosen_once_per_configuration",)),
    # issue 45: a NaN update that stops a --clip-norm run left the shards stepped during backward holding NaN
    Mutant("sib_nan_stop_keeps_the_nan_steps", "a NaN that stops the run leaves every shard as before that update",
           STEP, "        if self.step_in_backward.keep:  # leave the weights as they were where that is possible",
           "        if False:", (F + "test_a_nan_update_that_stops_a_clipped_run_leaves_every_shard_as_before_it",)),
]
