"""Mutants of shardtrain/trainer/precision/ (loss_scaler.py among them): fp16 loss scaling, bf16, --amp, non-finite
updates. Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

STEP = "tests/trainer/test_trainer_step.py"
SCALER = "tests/trainer/precision/test_loss_scaler.py"
AMP = "tests/trainer/precision/test_amp_flag.py"
ME_BF16 = "tests/optim/test_memory_efficient_adam.py::test_memory_efficient_bf16_stores_bf16_and_steps_fp32"

REGISTRATION = "tests/trainer/precision/test_precision_registration.py::"

MUTANTS = [
    Mutant("loss_scale_not_halved", "an overflow halves the scale",
           T + "precision/loss_scaler.py", "self.loss_scale /= self.scale_factor", "self.loss_scale /= 1.0",
           (SCALER,)),
    Mutant("loss_scale_never_grows", "the scale grows after --fp16-scale-window clean updates",
           T + "precision/loss_scaler.py", "            self.loss_scale *= self.scale_factor\n",
           "            pass\n",
           (SCALER,)),
    Mutant("fp16_overflow_not_skipped", "an overflow skips the update on every rank",
           T + "precision/fp16.py", "        self.scaler.overflow(update)\n        return False",
           "        self.scaler.overflow(update)\n        return True",
           (SCALER + "::test_overflow_skips_the_update_and_leaves_the_weights",)),
    Mutant("scale_window_ignores_update_freq", "--fp16-scale-window default 2**14 / world size / update-freq",
           T + "precision/fp16.py", "int(2 ** 14 / world_size / first(cfg.optimization.update_freq))",
           "int(2 ** 14 / world_size)",
           (SCALER + "::test_default_window_follows_fairseq",)),
    Mutant("unscale_factor_one", "fp16 gradients are unscaled (1/loss scale) before the step",
           T + "precision/fp16.py", "return 1.0 / self.scaler.loss_scale", "return 1.0",
           (SCALER,)),
    Mutant("loss_scale_not_checkpointed", "loss_scale is in checkpoints",
           T + "precision/fp16.py", 'return {"loss_scaler": self.scaler.state_dict()}', "return {}",
           (SCALER + "::test_loss_scale_is_checkpointed",)),
    Mutant("nan_update_applied", "a NaN/inf loss stops every rank before the weights change",
           T + "precision/component.py",
           "        if torch.isfinite(grad_norm):\n            self.nan_in_a_row = 0\n            return True",
           "        if True:\n            self.nan_in_a_row = 0\n            return True",
           (STEP + "::test_nan_loss_stops_naming_the_update_and_leaves_weights_intact",)),
    Mutant("skip_nan_counts_all_not_consecutive", "--skip-nan-updates N: up to N such updates in a row",
           T + "precision/component.py", "            self.nan_in_a_row = 0\n            return True",
           "            return True",
           (SCALER + "::test_skip_nan_updates_counts_only_consecutive_ones",)),
    Mutant("reduce_in_low_precision_default", "fp32 gradient reduction is the default under --bf16/--fp16",
           T + "precision/registry.py", "reduce_dtype=param_dtype if reduce_in_low_precision else torch.float32)",
           "reduce_dtype=param_dtype)",
           ("tests/trainer/precision/test_fsdp_mixed_precision.py",)),
    Mutant("amp_scale_flags_ignored", "--amp-init-scale and --amp-scale-window set --amp's loss scale",
           "shardtrain/trainer/precision/fp16.py", "    if common.amp and not common.fp16:", "    if False:",
           (AMP + "::test_amp_is_fp16_compute_with_fp32_weights_and_its_own_scale_flags",)),
    Mutant("memory_efficient_bf16_keeps_fp32_storage", "--memory-efficient-bf16 stores the model in bf16",
           "shardtrain/trainer/precision/memory_efficient_bf16.py", "    stores_in_compute = True",
           "    stores_in_compute = False", (ME_BF16,)),
]

# -- issue 40: precision as a registry of components ------------------------------------------------------------
PR = "tests/trainer/precision/"
CHOOSE = PR + "test_choose_precision.py"
MUTANTS += [
    Mutant("precision_flag_ignored", "--precision NAME picks that precision", T + "precision/choose.py",
           "    if name:\n        given.append(", "    if False:\n        given.append(", (CHOOSE,)),
    Mutant("implied_precision_conflicts", "--memory-efficient-fp16 with --fp16 is one precision, not two",
           T + "precision/choose.py", "    implied = {name for _, k in given for name in k.implies}",
           "    implied = set()", (CHOOSE,)),
    Mutant("plugin_precision_not_planned", "shard-plan weighs every registered precision marked planned",
           "shardtrain/plan/options.py", '    return {k.name: {**cleared, **own(k)} for k in kinds_with("planned")}',
           '    return {k.name: {**cleared, **own(k)} for k in kinds_with("planned")[:3]}',
           (PR + "test_plugin_precision.py",)),
    Mutant("registered_optimizer_fact_lost", "an optimizer's registration says it steps fp16/bf16 parameters in fp32",
           "shardtrain/optim/registry.py",
           "        builder.supports_memory_efficient_fp16 = supports_memory_efficient_fp16",
           "        builder.supports_memory_efficient_fp16 = False", (ME_BF16,)),
    Mutant("stored_low_precision_any_optimizer", "a precision storing the model in fp16/bf16 needs an fp32-state "
           "optimizer", "shardtrain/config/checks.py",
           "_precision(c) is k and not _keeps_fp32_state(c.components.optimizer)", "False",
           ("tests/cli/test_bad_input.py::test_each_compatibility_rule_is_refused_alone",)),
    # issue 45 item 4.12: a rollback's skip names --spike-rollback, not 2**62
    Mutant("rollback_skip_shows_a_count", "a NaN update --spike-rollback skips names it, not --skip-nan-updates 2**62",
           "shardtrain/trainer/precision/component.py", 'why = ("--spike-rollback rolls it back" if self.skip_nan == EVERY_UPDATE',
           'why = ("--spike-rollback rolls it back" if False',
           ("tests/trainer/precision/test_nan_skip_wording.py::test_a_rollback_s_skip_names_spike_rollback_not_a_count",)),
    Mutant("precision_compute_unchecked", "a precision whose compute is not float16/bfloat16/None is refused",
           T + "precision/registry.py", "    if cls.compute is not None and cls.compute not in COMPUTE_DTYPES:",
           "    if False:", (REGISTRATION + "test_a_precision_with_a_wrong_attribute_is_refused_at_registration",
                             REGISTRATION + "test_a_plugin_with_a_string_dtype_is_one_paragraph")),
    Mutant("precision_flag_clash_allowed", "a precision cannot claim a flag another precision has",
           T + "precision/registry.py", "    if clash:\n", "    if False:\n",
           (REGISTRATION + "test_a_precision_with_a_wrong_attribute_is_refused_at_registration",)),
    Mutant("precision_build_unchecked", "a precision's build() that returns no component is one paragraph",
           T + "precision/choose.py", "    if not isinstance(built, Precision):", "    if False:",
           (REGISTRATION + "test_a_build_that_returns_no_component_is_refused",)),
    Mutant("me_fp16_needs_grad_multiplier", "a plugin optimizer without grad_multiplier steps --memory-efficient-fp16",
           T + "precision/memory_efficient_fp16.py",
           "    its gradients unscaled in place first, as fairseq's do (Precision.step).\"\"\"\n",
           "    its gradients unscaled in place first, as fairseq's do (Precision.step).\"\"\"\n\n"
           "    def step(self, optimizer, backend, params, grad_multiplier):\n"
           "        assert hasattr(optimizer, \"grad_multiplier\"), type(optimizer)\n"
           "        super().step(optimizer, backend, params, grad_multiplier)\n",
           ("tests/trainer/precision/test_fp16_gradient_range.py::"
            "test_memory_efficient_fp16_steps_an_optimizer_without_a_grad_multiplier",)),
    # issue 45: a checkpoint resumed under another precision (no test resumed across precisions)
    Mutant("fp16_resume_needs_a_scaler", "an fp32 or bf16 checkpoint resumes under --fp16 with a fresh loss scaler",
           T + "precision/fp16.py", '        if "loss_scaler" in state:  # absent in checkpoints from fp32/bf16 runs',
           '        if True:  # absent in checkpoints from fp32/bf16 runs',
           ("tests/trainer/checkpoint/test_resume_other_precision.py::"
            "test_a_checkpoint_resumes_under_another_precision_with_that_precisions_state",)),
    Mutant("fp16_gradients_left_scaled", "fp16's loss scale is taken out of the gradients before the step",
           T + "precision/fp16.py", "        return 1.0 / self.scaler.loss_scale", "        return 1.0",
           ("tests/trainer/test_llama_components.py::test_half_precisions_track_fp32[fp16-0.005]",)),
]
