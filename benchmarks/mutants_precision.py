"""Mutants of shardtrain/trainer/precision.py and loss_scaler.py: fp16 loss scaling, bf16, --amp, non-finite
updates. Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

STEP = "tests/trainer/test_trainer_step.py"
SCALER = "tests/trainer/test_loss_scaler.py"
AMP = "tests/trainer/test_amp_flag.py"
ME_BF16 = "tests/optim/test_memory_efficient_adam.py::test_memory_efficient_bf16_stores_bf16_and_steps_fp32"

MUTANTS = [
    Mutant("loss_scale_not_halved", "an overflow halves the scale",
           T + "loss_scaler.py", "self.loss_scale /= self.scale_factor", "self.loss_scale /= 1.0",
           (SCALER,)),
    Mutant("loss_scale_never_grows", "the scale grows after --fp16-scale-window clean updates",
           T + "loss_scaler.py", "            self.loss_scale *= self.scale_factor\n",
           "            pass\n",
           (SCALER,)),
    Mutant("fp16_overflow_not_skipped", "an overflow skips the update on every rank",
           T + "precision.py", "        self.scaler.overflow(update)\n        return False",
           "        self.scaler.overflow(update)\n        return True",
           (SCALER + "::test_overflow_skips_the_update_and_leaves_the_weights",)),
    Mutant("scale_window_ignores_update_freq", "--fp16-scale-window default 2**14 / world size / update-freq",
           T + "precision.py", "int(2 ** 14 / world_size / first(cfg.optimization.update_freq))",
           "int(2 ** 14 / world_size)",
           (SCALER + "::test_default_window_follows_fairseq",)),
    Mutant("unscale_factor_one", "fp16 gradients are unscaled (1/loss scale) before the step",
           T + "precision.py", "return 1.0 / self.scaler.loss_scale", "return 1.0",
           (SCALER,)),
    Mutant("loss_scale_not_checkpointed", "loss_scale is in checkpoints",
           T + "precision.py", 'return {"loss_scaler": self.scaler.state_dict()}', "return {}",
           (SCALER + "::test_loss_scale_is_checkpointed",)),
    Mutant("nan_update_applied", "a NaN/inf loss stops every rank before the weights change",
           T + "precision.py",
           "        if torch.isfinite(grad_norm):\n            self.nan_in_a_row = 0\n            return True",
           "        if True:\n            self.nan_in_a_row = 0\n            return True",
           (STEP + "::test_nan_loss_stops_naming_the_update_and_leaves_weights_intact",)),
    Mutant("skip_nan_counts_all_not_consecutive", "--skip-nan-updates N: up to N such updates in a row",
           T + "precision.py", "            self.nan_in_a_row = 0\n            return True",
           "            return True",
           (SCALER + "::test_skip_nan_updates_counts_only_consecutive_ones",)),
    Mutant("reduce_in_low_precision_default", "fp32 gradient reduction is the default under --bf16/--fp16",
           T + "precision.py", "reduce_dtype=param_dtype if reduce_in_low_precision else torch.float32)",
           "reduce_dtype=param_dtype)",
           ("tests/trainer/test_fsdp_mixed_precision.py",)),
    Mutant("amp_scale_flags_ignored", "--amp-init-scale and --amp-scale-window set --amp's loss scale",
           "shardtrain/trainer/precision.py", "    if common.amp and not common.fp16:", "    if False:",
           (AMP + "::test_amp_is_fp16_compute_with_fp32_weights_and_its_own_scale_flags",)),
    Mutant("memory_efficient_bf16_keeps_fp32_storage", "--memory-efficient-bf16 stores the model in bf16",
           "shardtrain/trainer/precision.py", "    storage = compute if name in LOW_PRECISION_STORAGE else None",
           "    storage = None", (ME_BF16,)),
]
