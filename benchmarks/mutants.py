"""The mutants benchmarks/mutation.py applies: small, realistic bugs, each against a claim in README.md.

Each is one exact replacement of ``old`` (found exactly once in ``file``) by
``new``, and names the smallest set of tests that should catch it. When the
code changes and ``old`` no longer matches, fix the snippet: never drop a
mutant because no test catches it (that is a missing test).
"""
import dataclasses
from typing import Tuple


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    claim: str  # the README sentence it breaks, short
    file: str
    old: str
    new: str
    tests: Tuple[str, ...]


T = "shardtrain/trainer/"
STEP = "tests/trainer/test_trainer_step.py"
SCALER = "tests/trainer/test_loss_scaler.py"
E2E_RESUME = "tests/cli/test_cli_end_to_end.py::test_resume_mid_epoch_is_exact"
COUNTS = "tests/distributed/test_collective_counts.py"
ADAM = "tests/optim/test_optim_cpu_adam.py"

# The summed-loss backward of Trainer.train_step through _update's multiplier: one contiguous snippet,
# so that "divide the loss first" can be one replacement.
_BACKWARD_TO_MULTIPLIER = """\
                self.precision.backward(loss if sample else loss * 0.0)
            logs.append(log if sample else {k: 0 * v for k, v in log.items()})
        self.backend.reduce_grads(self.params)
        return self._update(logs, sample_size)

    def _update(self, logs: List[Dict], sample_size: float) -> Dict:
        # The gradients are loss_scale x the summed loss's gradient (averaged over ranks by
        # DDP/FSDP): one multiply makes them the gradient of the update's mean loss, clipped.
        ranks = self.backend.world_size if self.backend.grads_are_averaged else 1.0
        multiplier = self.precision.unscale_factor() * ranks / max(sample_size, 1.0)
"""

MUTANTS = [
    # -- gradients, norms, accumulation ----------------------------------------------------------
    Mutant("grad_norm_local_shard", "the gradient norm is always that of the full gradient",
           T + "backends/fsdp.py", "return norm.full_tensor() if isinstance(norm, DTensor) else norm",
           "return norm.to_local() if isinstance(norm, DTensor) else norm",
           (COUNTS,)),
    Mutant("accumulation_divides_twice", "--update-freq: the same training as one big batch",
           T + "trainer.py", "self.precision.backward(loss if sample else loss * 0.0)",
           "self.precision.backward(loss / len(samples) if sample else loss * 0.0)",
           (STEP + "::test_accumulation_equals_one_big_batch",)),
    Mutant("clip_coefficient_squared", "--clip-norm: torch's and fairseq's clip coefficient",
           T + "trainer.py", "multiplier *= clip / (float(gnorm) + 1e-6)",
           "multiplier *= (clip / (float(gnorm) + 1e-6)) ** 2",
           (STEP + "::test_gnorm_is_the_true_norm_and_clipping_scales_to_clip_norm",)),
    Mutant("filler_batch_weighted_in_loss", "an empty filler batch runs with zero weight",
           T + "trainer.py", "self.precision.backward(loss if sample else loss * 0.0)",
           "self.precision.backward(loss)",
           ("tests/distributed/test_backend_equivalence.py",)),
    Mutant("filler_batch_counted_in_logs", "an empty filler batch runs with zero weight (logged loss)",
           T + "trainer.py", "logs.append(log if sample else {k: 0 * v for k, v in log.items()})",
           "logs.append(log)",
           ("tests/distributed/test_backend_equivalence.py",)),
    Mutant("filler_batch_in_sample_size", "an empty filler batch runs with zero weight (sample size)",
           T + "trainer.py", "float(self.criterion_sample_size(s)) for s in samples if s]",
           "float(self.criterion_sample_size(s or self.dummy_batch)) for s in samples]",
           ("tests/distributed/test_backend_equivalence.py",)),
    Mutant("fsdp_unsharded_accumulation_syncs", "--fsdp-unsharded-accumulation reduces once per update",
           T + "backends/fsdp.py", "return _switched_off(module.set_requires_gradient_sync)",
           "return contextlib.nullcontext()",
           (COUNTS,)),
    Mutant("ddp_accumulation_syncs", "pytorch_ddp: no communication on --update-freq accumulation steps",
           T + "backends/ddp.py", "return module.no_sync()", "return super().no_sync(module)",
           (COUNTS,)),
    Mutant("hybrid_all_reduce_every_micro_batch", "hybrid_*: only the cross-replica all-reduce waits",
           T + "backends/fsdp.py", "return _switched_off(module.set_requires_all_reduce)",
           "return contextlib.nullcontext()",
           (COUNTS,)),
    Mutant("rank0_only_logging_sums", "logged losses are of the global batch (summed over ranks)",
           T + "trainer.py", "values = self.backend.all_reduce_sum(values.to(self.device)).cpu().tolist()",
           "values = values.cpu().tolist()",
           ("tests/distributed/test_backend_equivalence.py",)),
    Mutant("update_freq_ignored", "--update-freq N accumulates N batches per update",
           T + "loop.py", "itertools.islice(batches, update_freq)", "itertools.islice(batches, 1)",
           (E2E_RESUME,)),
    Mutant("max_update_off_by_one", "--max-update stops at that update",
           T + "loop.py", "if opt.max_update > 0 and updates >= opt.max_update:",
           "if opt.max_update > 0 and updates > opt.max_update:",
           (E2E_RESUME,)),
    Mutant("finished_run_trains_again", "relaunching a run that reached --max-update changes nothing",
           T + "loop.py", "if max_update > 0 and run.trainer.num_updates >= max_update:",
           "if max_update > 0 and run.trainer.num_updates > max_update:",
           ("tests/cli/test_save_dir_lock.py", "tests/cli/test_cli_end_to_end.py")),
    Mutant("validation_in_train_mode", "validation runs the model in eval mode (no dropout)",
           T + "trainer.py", "        self.model.eval()\n", "        self.model.train()\n",
           ("tests/cli/test_cli_end_to_end.py::test_checkpoint_names_keep_policy_and_validate_generate",)),
    Mutant("data_sharded_alike_on_every_rank", "every backend computes the training of the global batch",
           T + "loop.py", "num_shards=self.backend.world_size, shard_id=self.backend.rank,",
           "num_shards=self.backend.world_size, shard_id=0,",
           ("tests/distributed/test_backend_equivalence.py",)),
    # -- fp16 and loss scaling ----------------------------------------------------------------------
    Mutant("fp16_overflow_not_skipped", "an overflow skips the update on every rank",
           T + "precision.py", "        self.scaler.overflow(update)\n        return False",
           "        self.scaler.overflow(update)\n        return True",
           (SCALER + "::test_overflow_skips_the_update_and_leaves_the_weights",)),
    Mutant("loss_scale_not_halved", "an overflow halves the scale",
           T + "loss_scaler.py", "self.loss_scale /= self.scale_factor", "self.loss_scale /= 1.0",
           (SCALER,)),
    Mutant("loss_scale_never_grows", "the scale grows after --fp16-scale-window clean updates",
           T + "loss_scaler.py", "            self.loss_scale *= self.scale_factor\n",
           "            pass\n",
           (SCALER,)),
    Mutant("scale_window_ignores_update_freq", "--fp16-scale-window default 2**14 / world size / update-freq",
           T + "precision.py", "int(2 ** 14 / world_size / cfg.optimization.update_freq)",
           "int(2 ** 14 / world_size)",
           (SCALER + "::test_default_window_follows_fairseq",)),
    Mutant("unscale_factor_one", "fp16 gradients are unscaled (1/loss scale) before the step",
           T + "precision.py", "return 1.0 / self.scaler.loss_scale", "return 1.0",
           (SCALER,)),
    Mutant("fp16_loss_divided_first", "fp16: backward on the summed loss, 1/sample size applied afterwards",
           T + "trainer.py", _BACKWARD_TO_MULTIPLIER,
           _BACKWARD_TO_MULTIPLIER
           .replace("self.precision.backward(loss if sample else loss * 0.0)",
                    "self.precision.backward(loss / max(sample_size, 1.0) if sample else loss * 0.0)")
           .replace("* ranks / max(sample_size, 1.0)", "* ranks"),
           ("tests/trainer/test_fp16_gradient_range.py::test_logit_gradients_no_worse_than_fairseqs_scheme",)),
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
    # -- optimizers and schedules -------------------------------------------------------------------
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
    Mutant("warmup_off_by_one", "inverse_sqrt warms up linearly from --warmup-init-lr",
           "shardtrain/optim/lr_scheduler/inverse_sqrt.py", "lr = self.warmup_init_lr + num_updates * self.lr_step",
           "lr = self.warmup_init_lr + (num_updates + 1) * self.lr_step",
           ("tests/optim/test_optim_lr_schedulers.py",)),
    Mutant("lr_scheduler_state_not_saved", "checkpoints hold the lr scheduler",
           "shardtrain/optim/lr_scheduler/base.py",
           '        state = {name: getattr(self, name) for name in self.state_attrs}\n',
           "        state = {}\n",
           ("tests/optim/test_optim_lr_schedulers.py",)),
    Mutant("adafactor_column_stats_not_summed", "adafactor on fully_sharded sums its column statistics",
           "shardtrain/optim/adafactor.py", "        dist.all_reduce(on_mesh, group=self.group)\n", "",
           ("tests/distributed/test_optimizers_sharded.py",)),
    # -- checkpoints and resume ---------------------------------------------------------------------
    Mutant("data_position_not_restored", "a restart continues exactly (data-iterator position)",
           T + "resume.py", "        epoch_itr.load_state_dict(iterator_state)\n", "        pass\n",
           (E2E_RESUME,)),
    Mutant("optimizer_dropped_on_reshard", "a checkpoint saved on 2 ranks resumes on 1 or 3 (optimizer)",
           T + "sharded_checkpoints.py",
           "    if optimizer is not None:\n        state[\"optimizer\"] = get_optimizer_state_dict(model, optimizer)\n",
           "    if optimizer is not None and dist.get_world_size() == 2:\n"
           "        state[\"optimizer\"] = get_optimizer_state_dict(model, optimizer)\n",
           ("tests/distributed/test_sharded_checkpoints.py::test_resume_on_any_number_of_ranks_continues_exactly",)),
    Mutant("reshard_data_position_per_rank", "resharding: the data continues from the same global position",
           "shardtrain/data/iterators.py",
           'done = state_dict.get("global_batches_done", done * saved_shards) // self.num_shards',
           "done = done",
           ("tests/distributed/test_sharded_checkpoints.py::test_resume_on_any_number_of_ranks_continues_exactly",)),
    Mutant("rng_rank0_everywhere", "rank r restores its own RNG entry r",
           T + "rng.py", "return saved[rank()] if len(saved) == world_size() else None",
           "return saved[0] if len(saved) == world_size() else None",
           ("tests/trainer/test_rng_state.py", "tests/distributed/test_rng_per_rank_cpu.py")),
    Mutant("reseed_ignores_rank", "re-seeded from --seed, the update and its rank",
           T + "rng.py", 'digest = hashlib.sha256(f"{seed}/{num_updates}/{for_rank}".encode()).digest()',
           'digest = hashlib.sha256(f"{seed}/{num_updates}".encode()).digest()',
           ("tests/trainer/test_rng_state.py",)),
    Mutant("zero_checkpoint_holds_own_shard", "--zero-sharding os: checkpoints hold the full state keyed by name",
           T + "zero.py", 'merged.update(own["state"] if rank == self.rank else shard[0])',
           'merged.update(own["state"] if rank == self.rank else {})',
           ("tests/distributed/test_zero_sharding.py::test_checkpoints_hold_the_whole_name_keyed_state",)),
    Mutant("consolidate_drops_optimizer", "shard-consolidate without --model-only keeps the full training state",
           T + "consolidate.py", 'keys = {"model"} if model_only else {"model", "optimizer"}',
           'keys = {"model"}',
           ("tests/distributed/test_consolidate.py",)),
    Mutant("async_save_gate_missing", "--async-save: the next optimizer step waits until the write has landed",
           T + "async_staging.py", "            self.waited += 1\n            self._landed.wait()\n",
           "            self.waited += 1\n",
           ("tests/distributed/test_async_save_cpu.py",)),
    Mutant("weights_only_off", "checkpoints load with torch.load(weights_only=True)",
           T + "safe_loading.py", 'torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)',
           'torch.load(source, map_location="cpu", weights_only=False, mmap=mmap)',
           ("tests/trainer/test_safe_loading.py",)),
    Mutant("metadata_allowlist_bypassed", "a directory's .metadata is read by an allow-listed unpickler",
           T + "safe_loading.py", '        raise UnsafeGlobal(f"{module}.{name}")\n',
           "        return super().find_class(module, name)\n",
           ("tests/trainer/test_safe_loading.py",)),
    Mutant("incomplete_checkpoint_accepted", "naming an incomplete checkpoint directory is an error",
           T + "sharded_checkpoints.py", "    if not os.path.isfile(os.path.join(path, COMPLETE)):\n",
           "    if False:\n",
           ("tests/distributed/test_sharded_checkpoints.py", "tests/distributed/test_checkpoint_atomicity.py")),
    # -- configuration, launching, run control ---------------------------------------------------
    Mutant("refused_combination_accepted", "--zero-sharding os is refused with fully_sharded",
           "shardtrain/config/checks.py",
           'c.distributed.zero_sharding != "none" and c.distributed.ddp_backend == "fully_sharded"',
           'c.distributed.zero_sharding != "none" and c.distributed.ddp_backend == "no_such_backend"',
           ("tests/trainer/test_zero_decisions.py",)),
    Mutant("cpu_offload_without_fsdp_accepted", "--cpu-offload needs --ddp-backend fully_sharded",
           "shardtrain/config/checks.py",
           'c.distributed.cpu_offload and c.distributed.ddp_backend != "fully_sharded"',
           'c.distributed.cpu_offload and c.distributed.ddp_backend == "no_such_backend"',
           ("tests/cli/test_bad_input.py",)),
    Mutant("process_group_backend_unchanged", "on CUDA the group maps cuda:nccl,cpu:gloo",
           T + "rendezvous.py",
           '    return ",".join(f"{device}:{backend}" for device in devices) + ",cpu:gloo"\n',
           "    return backend\n",
           ("tests/distributed/test_accelerator_only_backend.py",)),
    Mutant("preemption_not_agreed", "every rank stops at the same update on SIGTERM/SIGUSR1",
           T + "preemption.py", "        if backend.world_size == 1:\n            return local\n",
           "        return local\n",
           ("tests/cli/test_preemption.py",)),
    Mutant("activation_checkpointing_off", "--checkpoint-activations recomputes each block in backward",
           T + "activation_checkpointing.py", "    if not torch.is_grad_enabled():\n", "    if True:\n",
           ("tests/trainer/test_activation_checkpointing.py",)),
    Mutant("registry_accepts_duplicates", "every registry rejects duplicate names",
           "shardtrain/registry.py", "        if name in self._entries:\n            raise ConfigError(",
           "        if False:\n            raise ConfigError(",
           ("tests/core/test_registry.py",)),
    Mutant("threads_ignore_local_ranks", "each rank uses usable cores / ranks on this node",
           T + "threads.py", "return ThreadPlan(max(1, cores // local),", "return ThreadPlan(max(1, cores),",
           ("tests/distributed_launch/test_thread_policy.py",)),
    # -- gradient scale and checkpoint crashes (issue 14: tests being rewritten by other helpers) ---------
    # These may only be caught once the rewritten tests/distributed/test_backend_equivalence.py,
    # test_optimizers_sharded.py, test_zero_sharding.py and the checkpoint crash tests are committed.
    Mutant("fsdp_not_averaging", "fully_sharded computes the same training as one process",
           T + "backends/fsdp.py", "class FullyShardedBackend(Backend):\n    grads_are_averaged = True\n",
           "class FullyShardedBackend(Backend):\n    grads_are_averaged = False\n",
           ("tests/distributed/test_backend_equivalence.py",)),
    Mutant("ddp_not_averaging", "pytorch_ddp computes the same training as one process",
           T + "backends/ddp.py", "class DDPBackend(Backend):\n    grads_are_averaged = True\n",
           "class DDPBackend(Backend):\n    grads_are_averaged = False\n",
           ("tests/distributed/test_backend_equivalence.py",)),
    Mutant("legacy_ddp_averages", "legacy_ddp sums all gradients in one flat all-reduce",
           T + "backends/legacy_ddp.py", "        dist.all_reduce(flat)\n",
           "        dist.all_reduce(flat)\n        flat /= dist.get_world_size()\n",
           ("tests/distributed/test_backend_equivalence.py",)),
    Mutant("single_file_save_not_atomic", "checkpoints are written atomically (temporary file, fsync, rename)",
           T + "checkpoints.py", "    with atomic_open(path) as f:\n        writer = _WriteErrors(f)\n",
           '    with open(path, "wb") as f:\n        writer = _WriteErrors(f)\n',
           ("tests/cli/test_full_disk.py", "tests/distributed/test_checkpoint_atomicity.py")),
    Mutant("sharded_rename_before_complete", "a directory appears under its name only when COMPLETE is written",
           T + "sharded_checkpoints.py",
           "    atomic_write_bytes(os.path.join(partial, COMPLETE), json.dumps(info).encode())\n"
           "    fsync_dir(partial)\n    replace_dir(partial, final)\n",
           "    replace_dir(partial, final)\n"
           "    atomic_write_bytes(os.path.join(final, COMPLETE), json.dumps(info).encode())\n"
           "    fsync_dir(final)\n",
           ("tests/distributed/test_checkpoint_atomicity.py",)),
]
