"""Mutants of the checkpoint keep policies (shardtrain/trainer/checkpoint/formats.py, keep_best.py): keep policies
(--keep-best-checkpoints too), save schedules and the validation schedule at non-default values, in both
checkpoint formats. Each mutant was seen to fail its tests (in a copy of the tree)."""
from mutant_spec import T, Mutant

KEEP = "tests/trainer/checkpoint/test_keep_policy_flags.py::"
SCHEDULE = "tests/trainer/checkpoint/test_validation_schedule_flags.py::"
KEEP_BOTH = KEEP + "test_keep_last_epochs_and_interval_updates"
NO_LAST = KEEP + "test_no_epoch_and_no_last_checkpoints_keep_the_interval_ones"
BEST = KEEP + "test_keep_best_leaves_nothing_the_policies_drop"
EVERY2 = KEEP + "test_save_interval_saves_every_second_epoch"
PATIENCE = SCHEDULE + "test_patience_stop_is_saved_and_a_relaunch_trains_no_more"
SUBSETS = SCHEDULE + "test_every_valid_subset_is_validated_in_batches_of_its_size"
LOOP, MANAGER = "shardtrain/trainer/loop.py", "shardtrain/trainer/checkpoint/manager.py"
RUN = "shardtrain/trainer/run.py"
VALIDATION = "shardtrain/trainer/validation.py"
DUE = "tests/trainer/test_loop_steps.py::test_due_validates_and_saves_where_fairseq_does"
SINGLE, SHARDED = "shardtrain/trainer/checkpoint/single_file.py", "shardtrain/trainer/checkpoint/sharded.py"
SHARDED_PRUNE = ("        prune_best(c)  # first: a directory only a dropped best-link named goes below, not at the "
                 "next save\n        if c.keep_last_epochs > 0:")
SHARDED_PRUNE_LATE = """        if c.keep_last_epochs > 0:"""

MUTANTS = [
    Mutant("keep_interval_one_too_many", "--keep-interval-updates N keeps the N newest update checkpoints",
           SINGLE, "matching(options.save_dir, pattern)[options.keep_interval_updates:]",
           "matching(options.save_dir, pattern)[options.keep_interval_updates + 1:]", (KEEP_BOTH + "[pytorch_ddp]",)),
    Mutant("keep_last_epochs_one_too_many", "--keep-last-epochs N keeps the N newest epoch checkpoints",
           SINGLE, '[options.keep_last_epochs:]', '[options.keep_last_epochs + 1:]', (KEEP_BOTH + "[pytorch_ddp]",)),
    Mutant("sharded_ignores_keep_interval", "sharded checkpoints follow --keep-interval-updates too",
           SHARDED, "keep = set(interval[:c.keep_interval_updates] if c.keep_interval_updates > 0 else interval)",
           "keep = set(interval)", (KEEP_BOTH + "[fully_sharded]",)),
    Mutant("sharded_ignores_keep_last_epochs", "sharded checkpoints follow --keep-last-epochs too",
           SHARDED, "        if c.keep_last_epochs > 0:", "        if False:", (KEEP_BOTH + "[fully_sharded]",)),
    Mutant("sharded_prunes_best_after_directories", "a sharded directory only a dropped best-link named goes "
           "with it, not at the next save", SHARDED, SHARDED_PRUNE, SHARDED_PRUNE_LATE,
           (BEST + "[fully_sharded]",)),
    Mutant("async_prune_before_links", "with --async-save the keep policies (--keep-best-checkpoints too) "
           "prune once the background save has put its names in place", SHARDED,
           "after=lambda: self.prune(options))", "after=None)\n        if is_master:\n            self.prune(options)",
           (BEST + "[fully_sharded-async]",)),
    Mutant("no_epoch_checkpoints_drops_interval_ones", "--no-epoch-checkpoints keeps --save-interval-updates' "
           "checkpoints, as fairseq", MANAGER,
           "if not end_of_epoch and c.save_interval_updates > 0 and updates % c.save_interval_updates == 0:",
           "if not end_of_epoch and c.save_interval_updates > 0 and updates % c.save_interval_updates == 0 "
           "and not c.no_epoch_checkpoints:", (NO_LAST + "[pytorch_ddp]", NO_LAST + "[fully_sharded]")),
    Mutant("no_epoch_checkpoints_ignored", "--no-epoch-checkpoints writes no checkpoint{epoch}.pt",
           MANAGER, "if end_of_epoch and not c.no_epoch_checkpoints and epoch % c.save_interval == 0:",
           "if end_of_epoch and epoch % c.save_interval == 0:", (NO_LAST + "[pytorch_ddp]",)),
    Mutant("no_last_checkpoints_ignored", "--no-last-checkpoints writes no checkpoint_last",
           MANAGER, "        if not c.no_last_checkpoints:", "        if True:", (NO_LAST + "[fully_sharded]",)),
    Mutant("save_interval_ignored", "--save-interval N saves every N-th epoch",
           VALIDATION, "do_save = ((end_of_epoch and epoch % ck.save_interval == 0)", "do_save = (end_of_epoch",
           (EVERY2 + "[pytorch_ddp]", DUE)),
    Mutant("validate_interval_ignored", "--validate-interval N validates every N-th epoch",
           VALIDATION, "(end_of_epoch and epoch % ds.validate_interval == 0)", "end_of_epoch",
           (EVERY2 + "[fully_sharded]", DUE)),
    Mutant("disable_validation_ignored", "--disable-validation runs no validation",
           VALIDATION, "and not ds.disable_validation and updates", "and updates", (KEEP_BOTH + "[pytorch_ddp]", DUE)),
    Mutant("validate_after_updates_off_by_one", "validation starts at update --validate-after-updates",
           VALIDATION, "and not ds.disable_validation and updates >= ds.validate_after_updates)",
           "and not ds.disable_validation and updates > ds.validate_after_updates)",
           (SCHEDULE + "test_validate_after_updates_holds_back_every_validation", DUE)),
    Mutant("validate_after_updates_ignored_by_saves", "update checkpoints wait for --validate-after-updates",
           VALIDATION, "or (on_interval and updates >= ds.validate_after_updates))", "or on_interval)",
           (SCHEDULE + "test_validate_after_updates_holds_back_the_interval_saves", DUE)),
    Mutant("validate_interval_updates_ignored", "--validate-interval-updates N validates every N updates",
           VALIDATION, "on_valid_interval = ds.validate_interval_updates > 0 and", "on_valid_interval = False and",
           (SCHEDULE + "test_validate_after_updates_holds_back_every_validation", DUE)),
    Mutant("max_tokens_valid_ignored_in_a_schedule", "--max-tokens-valid caps the tokens of a validation batch",
           RUN, "max_tokens=(d.max_tokens_valid or max_tokens) if valid else max_tokens", "max_tokens=max_tokens",
           (SCHEDULE + "test_validate_after_updates_holds_back_every_validation",)),
    Mutant("batch_size_valid_ignored_per_subset", "--batch-size-valid caps the sequences of a validation batch",
           RUN, "max_sentences=(d.batch_size_valid or d.batch_size) if valid else d.batch_size",
           "max_sentences=d.batch_size", (SUBSETS,)),
    Mutant("valid_subset_first_only", "every --valid-subset is validated",
           VALIDATION, 'for subset in run.cfg.dataset.valid_subset.split(","):',
           'for subset in run.cfg.dataset.valid_subset.split(",")[:1]:', (SUBSETS,)),
    Mutant("interval_save_at_update_0", "an epoch that trained nothing (update 0) is no --save-interval-updates "
           "multiple, as in fairseq", VALIDATION, "on_interval = ck.save_interval_updates > 0 and updates > 0 and",
           "on_interval = ck.save_interval_updates > 0 and",
           (SCHEDULE + "test_an_epoch_with_no_update_is_not_an_interval_save", DUE)),
    Mutant("valid_interval_at_update_0", "an epoch that trained nothing (update 0) is no "
           "--validate-interval-updates multiple, as in fairseq", VALIDATION,
           "on_valid_interval = ds.validate_interval_updates > 0 and updates > 0 and",
           "on_valid_interval = ds.validate_interval_updates > 0 and",
           (SCHEDULE + "test_an_epoch_with_no_update_is_not_an_interval_save", DUE)),
    Mutant("patience_stop_not_saved", "the update --patience stops at is saved, as fairseq",
           LOOP, "should_stop = do_save = True  # as fairseq", "should_stop = True  # as fairseq", (PATIENCE,)),
    Mutant("patience_relaunch_trains_on", "relaunching a run --patience stopped trains no more",
           LOOP, "if cfg.checkpoint.patience > 0 and run.trainer.state.num_bad_validations >= cfg.checkpoint.patience:",
           "if False:", (PATIENCE,)),
    Mutant("keep_interval_prunes_newest", "fairseq's keep-policies (--keep-interval-updates)",
           T + "checkpoint/formats.py", "return [p for _, p in sorted(found, reverse=True)]",
           "return [p for _, p in sorted(found)]",
           ("tests/e2e/test_cli_end_to_end.py::test_checkpoint_names_keep_policy_and_validate_generate",)),
    Mutant("keep_best_never_pruned", "--keep-best-checkpoints N keeps only the N best",
           "shardtrain/trainer/checkpoint/keep_best.py", "        os.remove(path)", "        pass",
           ("tests/trainer/checkpoint/test_keep_best_checkpoints.py",)),
    Mutant("keep_best_keeps_the_worst", "--keep-best-checkpoints keeps the best, not the worst",
           "shardtrain/trainer/checkpoint/keep_best.py", "    if not checkpoint.maximize_best_checkpoint_metric:\n",
           "    if checkpoint.maximize_best_checkpoint_metric:\n",
           ("tests/trainer/checkpoint/test_keep_best_checkpoints.py",)),
]
