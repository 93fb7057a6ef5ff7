"""Mutants of shardtrain/trainer/loop.py, rng.py, train_state.py and preflight.py: the run loop, validation, saves,
stopping, per-rank RNG. Each mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

E2E_RESUME = "tests/e2e/test_cli_end_to_end.py::test_resume_mid_epoch_is_exact"
EQUIVALENCE = "tests/trainer/parallel/test_backend_equivalence.py::test_two_ranks_equal_one_process"
LISTS = "tests/optim/test_optim_epoch_lists.py"
PLATEAU_RESUME = "tests/optim/test_plateau_resume.py::test_plateau_steps_on_validation_and_resumes_exactly"
_STEP = ("    if end_of_epoch:  # before the save, so a resumed run continues from the stepped schedule\n"
         "        run.trainer.lr_step(epoch, valid_loss)\n")
_SAVE_START = "    if do_save and not ck.no_save:\n        save(run, epoch_itr, end_of_epoch, is_best, valid_loss)\n"
_STEP_AFTER = "valid_loss)\n    if end_of_epoch:\n        run.trainer.lr_step(epoch, valid_loss)\n"
DEMO = "tests/e2e/test_demo.py::"
E2E = "tests/e2e/test_cli_end_to_end.py::"
EARLY = "tests/cli/test_fail_early.py::test_refused_before_any_rank_starts_in_each_front_ends_words"

MUTANTS = [
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
           ("tests/cli/test_fail_early.py::test_rerunning_a_finished_run_changes_nothing",)),
    Mutant("data_sharded_alike_on_every_rank", "every backend computes the training of the global batch",
           T + "run.py", "num_shards=self.backend.world_size, shard_id=self.backend.rank,",
           "num_shards=self.backend.world_size, shard_id=0,",
           (EQUIVALENCE,)),
    Mutant("activation_checkpointing_not_wired", "--checkpoint-activations is applied by the training run",
           T + "build.py", "precision.param_dtype, facts.checkpoint_every,", "precision.param_dtype, None,",
           ("tests/trainer/parallel/test_activation_checkpointing.py::test_training_run_and_checkpoint_are_identical",)),
    Mutant("checkpoint_every_k_ignored", "--checkpoint-activations-every K: only every K-th block",
           T + "parallel/activation_checkpointing.py", "return distributed.checkpoint_activations_every if on else None",
           "return 1 if on else None",
           ("tests/trainer/parallel/test_activation_checkpointing.py::test_training_run_and_checkpoint_are_identical",)),
    Mutant("stop_time_not_agreed", "--stop-time-hours saves before stopping",
           T + "loop.py", "if run.preemption.agreed(run.backend, also=time_up):",
           "if run.preemption.agreed(run.backend):",
           ("tests/e2e/test_cli_end_to_end.py::test_patience_and_stop_time_end_training_early",)),
    # fairseq's order: the end-of-epoch checkpoint holds the schedule before that epoch's step
    Mutant("plateau_stepped_after_the_save", "a resumed reduce_lr_on_plateau shrinks the lr when the uninterrupted run would",
           "shardtrain/trainer/loop.py", _STEP + _SAVE_START, _SAVE_START.replace("valid_loss)\n", _STEP_AFTER),
           (PLATEAU_RESUME,)),
    Mutant("update_freq_list_first_only", "--update-freq 4,2 accumulates update_freq[epoch - 1] batches, as fairseq",
           "shardtrain/trainer/loop.py", "for_epoch(cfg.optimization.update_freq, epoch_itr.epoch)",
           "for_epoch(cfg.optimization.update_freq, 1)", (LISTS + "::test_training_follows_both_lists",)),
    Mutant("max_valid_steps_ignored", "--max-valid-steps N validates on N batches",
           "shardtrain/trainer/validation.py", "itertools.islice(progress, run.cfg.dataset.max_valid_steps)",
           "progress",
           ("tests/trainer/test_valid_step_flags.py::test_max_valid_steps_limits_the_batches",)),
    Mutant("fixed_validation_seed_reseeds_training", "--fixed-validation-seed leaves training's random state alone",
           "shardtrain/trainer/validation.py", "    with _forked_rng(run.backend.device):", "    if True:",
           ("tests/trainer/test_valid_step_flags.py::test_fixed_validation_seed_leaves_training_randomness_alone",)),
    Mutant("valid_throughput_not_logged", "validation records carry fairseq's valid_wps, valid_wpb, valid_bsz",
           "shardtrain/trainer/validation.py", "            log_throughput(metrics, logs, since)  # valid_wps",
           "            pass  # valid_wps", (E2E + "test_checkpoint_names_keep_policy_and_validate_generate",)),
    Mutant("config_printed_whole", "the log shows the config compactly; the whole of it is in the save dir",
           "shardtrain/trainer/loop.py",
           'logger.info("config:\\n" + config_summary(cfg, os.path.join(cfg.checkpoint.save_dir, CONFIG_FILE)))',
           'logger.info("config:\\n" + OmegaConf.to_yaml(cfg))', (DEMO + "test_demo_runs_on_a_small_stdlib_corpus",)),
    Mutant("slurm_not_requeued", "SIGUSR1 under SLURM requeues the job once checkpoint_last is saved",
           "shardtrain/trainer/loop.py", "    if run.stopped_by_signal and ctx.is_master:", "    if False:",
           ("tests/trainer/launch/test_preemption.py::test_signal_saves_and_exits_zero_then_resumes",)),
    Mutant("splits_checked_in_ranks", "every split a run names is checked before any rank starts",
           "shardtrain/trainer/preflight.py", 'check_split = getattr(task, "check_split", None)', "check_split = None",
           (EARLY,)),
    Mutant("rng_rank0_everywhere", "rank r restores its own RNG entry r",
           T + "rng.py", "return saved[rank()] if len(saved) == world_size() else None",
           "return saved[0] if len(saved) == world_size() else None",
           ("tests/trainer/test_rng_state.py", "tests/trainer/test_rng_per_rank_cpu.py")),
    Mutant("reseed_ignores_rank", "re-seeded from --seed, the update and its rank",
           T + "rng.py", 'digest = hashlib.sha256(f"{seed}/{num_updates}/{for_rank}".encode()).digest()',
           'digest = hashlib.sha256(f"{seed}/{num_updates}".encode()).digest()',
           ("tests/trainer/test_rng_state.py",)),
    Mutant("training_time_not_restored", "--stop-time-hours counts the time of the runs a checkpoint resumes",
           T + "train_state.py", "        self.previous = seconds\n", "        pass\n",
           ("tests/trainer/checkpoint/test_resume_contents.py",)),
    # -- issue 40: the run's facts, decided once --------------------------------------------------------------
    Mutant("run_facts_checkpointing_lost", "the run's facts say whether (and every how many blocks) it checkpoints",
           "shardtrain/trainer/run_facts.py", "ranks_per_node, checkpoint_every(cfg.distributed), ",
           "ranks_per_node, None, ", ("tests/trainer/test_run_facts.py",)),
    Mutant("run_facts_precision_not_the_chosen", "the run's facts hold the precision the flags pick",
           "shardtrain/trainer/run_facts.py", "bool(cfg.optimization.spike_rollback), chosen(cfg.common),",
           "bool(cfg.optimization.spike_rollback), chosen(types.SimpleNamespace()),",
           ("tests/trainer/test_run_facts.py",)),
    Mutant("run_facts_ranks_per_node_ignored", "a hybrid shard group is a node's ranks, from the launcher's count",
           "shardtrain/trainer/run_facts.py", "    shards = backend.parameter_shards(cfg.distributed, world_size, ranks_per_node)",
           "    shards = backend.parameter_shards(cfg.distributed, world_size, world_size)",
           ("tests/trainer/test_run_facts.py",)),
]

