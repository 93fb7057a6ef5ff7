"""Mutants of shardtrain/optim/: optimizers (cpu_adam, adafactor, nag, adam's fairseq flags) and lr schedulers.
Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

ADAM = "tests/optim/test_optim_cpu_adam.py"
NAG = "tests/optim/test_optim_nag.py"
PLATEAU = "tests/optim/test_optim_plateau.py"
LISTS = "tests/optim/test_optim_epoch_lists.py"
ADAM_FLAGS = "tests/optim/test_optim_adam_fairseq_flags.py"
ME_BF16 = "tests/optim/test_memory_efficient_adam.py::test_memory_efficient_bf16_stores_bf16_and_steps_fp32"
PLATEAU_RESUME = "tests/optim/test_plateau_resume.py::test_plateau_steps_on_validation_and_resumes_exactly"
SPIKE = "tests/trainer/test_spike_rollback.py::"

MUTANTS = [
    Mutant("adafactor_column_stats_not_summed", "adafactor on fully_sharded sums its column statistics",
           "shardtrain/optim/adafactor.py", "        dist.all_reduce(on_mesh, group=self.group)\n", "",
           ("tests/trainer/parallel/test_optimizers_sharded.py",)),
    Mutant("cpu_adam_step_not_advanced", "cpu_adam equals torch's Adam/AdamW (bias correction)",
           "shardtrain/optim/cpu_adam.py", '[s["step"] for s in states], grad_scale)',
           '[s["step"].clone() for s in states], grad_scale)',
           (ADAM + "::test_equals_torch_adam",)),
    Mutant("cpu_adam_chunked_bias_correction", "cpu_adam equals torch's Adam (chunked / low-precision path)",
           "shardtrain/optim/cpu_adam.py", 'step.copy_(state["step"])', "step.zero_()",
           (ADAM,)),
    Mutant("cpu_adam_coupled_decay", "cpu_adam --adamw-mode: decoupled weight decay",
           "shardtrain/optim/cpu_adam.py", 'decoupled_weight_decay=group["adamw_mode"]',
           "decoupled_weight_decay=False",
           (ADAM,)),
    Mutant("cpu_adam_multiplier_dropped", "cpu_adam applies the gradient multiplier (unscale, clip)",
           "shardtrain/optim/cpu_adam.py", "grad_scale = None if multiplier == 1.0 else torch.tensor(1.0 / multiplier)",
           "grad_scale = None",
           (ADAM + "::test_grad_multiplier_equals_multiplied_gradients",)),
    Mutant("memory_efficient_adam_keeps_torch_adam", "--optimizer adam --memory-efficient-fp16 trains, with fp32 moments",
           "shardtrain/optim/cpu_adam.py", "    if spec.cls not in (torch.optim.Adam, torch.optim.AdamW):\n",
           "    if True:\n", ("tests/optim/test_memory_efficient_adam.py::test_adam_trains_with_memory_efficient_fp16",)),
    Mutant("memory_efficient_adam_drops_decay_mode", "--no-adamw-mode is kept when adam steps fp16 parameters",
           "shardtrain/optim/cpu_adam.py", "adamw_mode=spec.cls is torch.optim.AdamW", "adamw_mode=True",
           ("tests/optim/test_memory_efficient_adam.py::test_adam_spec_becomes_fp32_state_adam_for_fp16_parameters",)),
    Mutant("lr_scheduler_state_not_saved", "checkpoints hold the lr scheduler",
           "shardtrain/optim/lr_scheduler/base.py",
           '        state = {name: getattr(self, name) for name in self.state_attrs}\n',
           "        state = {}\n",
           ("tests/optim/test_optim_lr_schedulers.py",)),
    Mutant("lr_list_taken_by_any_schedule", "only the fixed schedule takes an --lr list; the others refuse it",
           "shardtrain/optim/lr_scheduler/base.py", "require(len(self.lrs) == 1 or self.takes_lr_list,",
           "require(True,", (LISTS + "::test_only_fixed_takes_an_lr_list",)),
    Mutant("lr_scale_not_saved", "a checkpoint keeps the learning-rate scale",
           "shardtrain/optim/lr_scheduler/base.py", 'state_attrs: Tuple[str, ...] = ("best", "lr_scale")',
           'state_attrs: Tuple[str, ...] = ("best",)',
           (SPIKE + "test_a_sharded_checkpoint_after_a_rollback_resumes_exactly",)),
    Mutant("fixed_lr_list_first_only", "--lr-scheduler fixed takes lr[epoch - 1] of an --lr list, as fairseq",
           "shardtrain/optim/lr_scheduler/fixed.py", "            return for_epoch(self.lrs, epoch)",
           "            return self.peak_lr", (LISTS + "::test_fixed_takes_the_epochs_lr",)),
    Mutant("warmup_off_by_one", "inverse_sqrt warms up linearly from --warmup-init-lr",
           "shardtrain/optim/lr_scheduler/inverse_sqrt.py", "lr = self.warmup_init_lr + num_updates * self.lr_step",
           "lr = self.warmup_init_lr + (num_updates + 1) * self.lr_step",
           ("tests/optim/test_optim_lr_schedulers.py",)),
    Mutant("plateau_ignores_maximize", "reduce_lr_on_plateau follows --maximize-best-checkpoint-metric",
           "shardtrain/optim/lr_scheduler/reduce_lr_on_plateau.py", 'mode="max" if maximize else "min"', 'mode="min"',
           (PLATEAU + "::test_plateau_shrinks_as_fairseq",)),
    Mutant("plateau_bad_epochs_not_saved", "a resumed reduce_lr_on_plateau shrinks the lr when the uninterrupted run would",
           "shardtrain/optim/lr_scheduler/reduce_lr_on_plateau.py",
           '_PLATEAU_STATE = ("best", "num_bad_epochs", "last_epoch", "cooldown_counter")',
           '_PLATEAU_STATE = ("best", "last_epoch", "cooldown_counter")',
           (PLATEAU_RESUME,)),
    Mutant("plateau_steps_during_warmup", "reduce_lr_on_plateau sees the metric only after warmup, as fairseq",
           "shardtrain/optim/lr_scheduler/reduce_lr_on_plateau.py", "if val_loss is not None and self.warmup_end:",
           "if val_loss is not None:", (PLATEAU + "::test_plateau_warmup_then_plateau_rule",)),
    Mutant("nag_buffer_not_rescaled", "nag steps as fairseq's NAG, rescaling its momentum when the lr changes",
           "shardtrain/optim/nag.py", "correction = lr / lr_old if lr_old > 0 else lr",
           "correction = 1.0",
           (NAG + "::test_nag_steps_as_fairseqs_formula_with_a_changing_lr",)),
    Mutant("nag_weight_decay_as_l2", "nag's weight decay shrinks the weights by lr * weight_decay, as fairseq's",
           "shardtrain/optim/nag.py", "            weights.mul_(1 - lr * weight_decay)\n",
           "            grad = grad + weight_decay * weights\n",
           (NAG + "::test_nag_steps_as_fairseqs_formula_with_a_changing_lr",)),
    Mutant("use_old_adam_ignored", "--use-old-adam picks the plain (for-each) Adam, not the fused kernel",
           "shardtrain/optim/optimizers.py", "    if cfg.use_old_adam:\n", "    if False:\n",
           (ADAM_FLAGS + "::test_use_old_adam_is_the_plain_implementation_with_the_same_update",)),
    Mutant("fp16_adam_stats_ignored_by_adam", "--optimizer adam --fp16-adam-stats keeps fp16 moments",
           "shardtrain/optim/optimizers.py", "    if cfg.fp16_adam_stats:\n", "    if False:\n",
           (ADAM_FLAGS + "::test_fp16_adam_stats_keeps_fp16_moments_on_the_cpu",)),
    Mutant("memory_efficient_bf16_torch_adam", "--memory-efficient-bf16 with adam keeps fp32 moments",
           "shardtrain/trainer/build.py", "    if chosen(cfg.common).stores_in_compute:",
           '    if chosen(cfg.common).name == "memory_efficient_fp16":', (ME_BF16,)),
    Mutant("adafactor_state_follows_the_mesh", "adafactor's sharded statistics stay in the gradient's memory "
           "(host memory under --cpu-offload on a GPU; the first GPU run failed so)", "shardtrain/optim/adafactor.py",
           "    return dtensor_where_it_is(local.new_zeros(local_shape, dtype=dtype), like.device_mesh, placements, shape)",
           "    return type(like).from_local(local.new_zeros(local_shape, dtype=dtype), like.device_mesh, placements,\n"
           "                              shape=shape, stride=torch.empty(shape, device='meta').stride())",
           ("tests/optim/test_optim_adafactor.py::test_sharded_state_stays_in_the_gradients_memory_when_the_mesh_is_"
            "elsewhere",)),
]
