"""Mutants of issue 17 helper B's claims: nag, reduce_lr_on_plateau, the notice when a fairseq-style command
relies on our default optimizer/scheduler, adam with --memory-efficient-fp16, --lr/--update-freq lists, --amp,
--memory-efficient-bf16, adam's --use-old-adam and --fp16-adam-stats.
benchmarks/mutants.py adds them to its list (same rules)."""
from mutant_spec import Mutant

NAG = "tests/optim/test_optim_nag.py"
PLATEAU = "tests/optim/test_optim_plateau.py"
LISTS = "tests/optim/test_optim_epoch_lists.py"
AMP = "tests/trainer/test_amp_flag.py"
ADAM_FLAGS = "tests/optim/test_optim_adam_fairseq_flags.py"
ME_BF16 = "tests/trainer/test_memory_efficient_adam.py::test_memory_efficient_bf16_stores_bf16_and_steps_fp32"
PLATEAU_RESUME = "tests/trainer/test_plateau_resume.py::test_plateau_steps_on_validation_and_resumes_exactly"
_STEP = ("    if end_of_epoch:  # before the save, so a resumed run continues from the stepped schedule\n"
         "        run.trainer.lr_step(epoch, valid_loss)\n")
_SAVE_START = ("    if do_save and not ck.no_save:\n        start = time.time()\n"
               "        names = run.checkpoints.names_for(epoch, updates, end_of_epoch, is_best, valid_loss)\n"
               "        check_finite(run.trainer.model, run.trainer.optimizer, run.backend, updates)  # on every rank\n"
               "        paths = run.checkpoints.save(header(run), stateful_parts(run, epoch_itr), epoch, updates, names)\n")
_STEP_AFTER = "names)\n        if end_of_epoch:\n            run.trainer.lr_step(epoch, valid_loss)\n"

I17_B_MUTANTS = [
    Mutant("nag_buffer_not_rescaled", "nag steps as fairseq's NAG, rescaling its momentum when the lr changes",
           "shardtrain/optim/nag.py", "correction = lr / lr_old if lr_old > 0 else lr",
           "correction = 1.0",
           (NAG + "::test_nag_steps_as_fairseqs_formula_with_a_changing_lr",)),
    Mutant("nag_weight_decay_as_l2", "nag's weight decay shrinks the weights by lr * weight_decay, as fairseq's",
           "shardtrain/optim/nag.py", "            weights.mul_(1 - lr * weight_decay)\n",
           "            grad = grad + weight_decay * weights\n",
           (NAG + "::test_nag_steps_as_fairseqs_formula_with_a_changing_lr",)),
    Mutant("plateau_ignores_maximize", "reduce_lr_on_plateau follows --maximize-best-checkpoint-metric",
           "shardtrain/optim/lr_scheduler/reduce_lr_on_plateau.py", 'mode="max" if maximize else "min"', 'mode="min"',
           (PLATEAU + "::test_plateau_shrinks_as_fairseq",)),
    Mutant("plateau_bad_epochs_not_saved", "a resumed reduce_lr_on_plateau shrinks the lr when the uninterrupted run would",
           "shardtrain/optim/lr_scheduler/reduce_lr_on_plateau.py",
           '_PLATEAU_STATE = ("best", "num_bad_epochs", "last_epoch", "cooldown_counter")',
           '_PLATEAU_STATE = ("best", "last_epoch", "cooldown_counter")',
           (PLATEAU_RESUME,)),
    # fairseq's order: the end-of-epoch checkpoint holds the schedule before that epoch's step
    Mutant("plateau_stepped_after_the_save", "a resumed reduce_lr_on_plateau shrinks the lr when the uninterrupted run would",
           "shardtrain/trainer/loop.py", _STEP + _SAVE_START, _SAVE_START.replace("names)\n", _STEP_AFTER),
           (PLATEAU_RESUME,)),
    Mutant("plateau_steps_during_warmup", "reduce_lr_on_plateau sees the metric only after warmup, as fairseq",
           "shardtrain/optim/lr_scheduler/reduce_lr_on_plateau.py", "if val_loss is not None and self.warmup_end:",
           "if val_loss is not None:", (PLATEAU + "::test_plateau_warmup_then_plateau_rule",)),
    Mutant("default_schedule_notice_missing", "a fairseq-style --lr without --lr-scheduler is told what runs instead",
           "shardtrain/cli/train.py", "    if notice:  # logged once", "    if False:  # logged once",
           ("tests/optim/test_optim_fairseq_defaults.py::test_shard_train_logs_the_notice_once",)),
    Mutant("default_schedule_notice_on_explicit_scheduler", "the notice is only for commands that rely on the default",
           "shardtrain/optim/fairseq_defaults.py", '    if _given(argv, "--lr-scheduler"):\n        return None\n', "",
           ("tests/optim/test_optim_fairseq_defaults.py",)),
    Mutant("memory_efficient_adam_keeps_torch_adam", "--optimizer adam --memory-efficient-fp16 trains, with fp32 moments",
           "shardtrain/optim/cpu_adam.py", "    if spec.cls not in (torch.optim.Adam, torch.optim.AdamW):\n",
           "    if True:\n", ("tests/trainer/test_memory_efficient_adam.py::test_adam_trains_with_memory_efficient_fp16",)),
    Mutant("memory_efficient_adam_drops_decay_mode", "--no-adamw-mode is kept when adam steps fp16 parameters",
           "shardtrain/optim/cpu_adam.py", "adamw_mode=spec.cls is torch.optim.AdamW", "adamw_mode=True",
           ("tests/trainer/test_memory_efficient_adam.py::test_adam_spec_becomes_fp32_state_adam_for_fp16_parameters",)),
    Mutant("update_freq_list_first_only", "--update-freq 4,2 accumulates update_freq[epoch - 1] batches, as fairseq",
           "shardtrain/trainer/loop.py", "for_epoch(cfg.optimization.update_freq, epoch_itr.epoch)",
           "for_epoch(cfg.optimization.update_freq, 1)", (LISTS + "::test_training_follows_both_lists",)),
    Mutant("fixed_lr_list_first_only", "--lr-scheduler fixed takes lr[epoch - 1] of an --lr list, as fairseq",
           "shardtrain/optim/lr_scheduler/fixed.py", "            return for_epoch(self.lrs, epoch)",
           "            return self.peak_lr", (LISTS + "::test_fixed_takes_the_epochs_lr",)),
    Mutant("epoch_lists_not_normalized", "one typed representation: --lr/--update-freq are lists in every config",
           "shardtrain/config/build.py", "        epoch_lists.normalize(cfg.optimization)\n", "",
           (LISTS + "::test_one_typed_list_from_flags_configs_and_hydra_style_values",)),
    Mutant("lr_list_taken_by_any_schedule", "only the fixed schedule takes an --lr list; the others refuse it",
           "shardtrain/optim/lr_scheduler/base.py", "require(len(self.lrs) == 1 or self.takes_lr_list,",
           "require(True,", (LISTS + "::test_only_fixed_takes_an_lr_list",)),
    Mutant("amp_ignored", "--amp trains in fp16 autocast with fp32 weights and a dynamic loss scale",
           "shardtrain/config/sections.py", 'return "fp16" if common.fp16 or common.amp else "fp32"',
           'return "fp16" if common.fp16 else "fp32"', (AMP,)),
    Mutant("amp_scale_flags_ignored", "--amp-init-scale and --amp-scale-window set --amp's loss scale",
           "shardtrain/trainer/precision.py", "    if common.amp and not common.fp16:", "    if False:",
           (AMP + "::test_amp_is_fp16_compute_with_fp32_weights_and_its_own_scale_flags",)),
    Mutant("memory_efficient_bf16_keeps_fp32_storage", "--memory-efficient-bf16 stores the model in bf16",
           "shardtrain/trainer/precision.py", "    storage = compute if name in LOW_PRECISION_STORAGE else None",
           "    storage = None", (ME_BF16,)),
    Mutant("memory_efficient_bf16_torch_adam", "--memory-efficient-bf16 with adam keeps fp32 moments",
           "shardtrain/trainer/build.py", "    if chosen_precision(cfg.common) in LOW_PRECISION_STORAGE:",
           '    if chosen_precision(cfg.common) == "memory_efficient_fp16":', (ME_BF16,)),
    Mutant("use_old_adam_ignored", "--use-old-adam picks the plain (for-each) Adam, not the fused kernel",
           "shardtrain/optim/optimizers.py", "    if cfg.use_old_adam:\n", "    if False:\n",
           (ADAM_FLAGS + "::test_use_old_adam_is_the_plain_implementation_with_the_same_update",)),
    Mutant("fp16_adam_stats_ignored_by_adam", "--optimizer adam --fp16-adam-stats keeps fp16 moments",
           "shardtrain/optim/optimizers.py", "    if cfg.fp16_adam_stats:\n", "    if False:\n",
           (ADAM_FLAGS + "::test_fp16_adam_stats_keeps_fp16_moments_on_the_cpu",)),
]
MUTANTS = I17_B_MUTANTS
