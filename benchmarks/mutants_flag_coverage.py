"""Issue 29, part 1: the flag-coverage check, fairseq flag states held to written-down lists, and the flags
of [components], [common], [dataset and batching] and [distributed training] at non-default values.
Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

COVERAGE = "tests/config/test_flag_coverage.py::"
CHECKER = COVERAGE + "test_a_marker_whose_flag_the_module_never_passes_is_reported"
TABLE = "tests/config/test_fairseq_flag_table.py::"
BATCHING = "tests/trainer/test_batching_flag_effects.py::"
COMMON = "tests/trainer/test_common_flag_effects.py::"
DIST = "tests/trainer/parallel/test_distributed_flag_effects.py::"
CHOICE = "tests/trainer/test_component_choice_effects.py::"
LOOP = "shardtrain/trainer/loop.py"
RUN = "shardtrain/trainer/run.py"
VALIDATION = "shardtrain/trainer/validation.py"

MUTANTS = [
    Mutant("coverage_skips_the_literal_check", "a flag_effect marker counts only if the module passes the flag",
           "benchmarks/flag_coverage.py",
           "elif not _passed(arg.value, by_spelling[arg.value].key, text, exact):", "elif False:", (CHECKER,)),
    Mutant("coverage_counts_the_markers_own_literal", "the marker's own string is no evidence the test passes it",
           "benchmarks/flag_coverage.py",
           "skip = {id(arg) for node in ast.walk(tree) for arg in (_marker_args(node) or ())}", "skip = set()",
           (CHECKER,)),
    Mutant("refused_flag_becomes_accepted", "a fairseq flag that would change results is refused",
           "shardtrain/config/fairseq_flags.py", 'refuse("--use-bmuf", "BMUF is not supported;',
           'accept("--use-bmuf", "BMUF is not supported;',
           (COVERAGE + "test_fairseq_flag_states_are_the_written_down_ones",
            TABLE + "test_refused_flags_exit_2_with_their_paragraph")),
    Mutant("batch_size_multiple_ignored", "--required-batch-size-multiple rounds the batches",
           RUN, "required_batch_size_multiple=d.required_batch_size_multiple,", "required_batch_size_multiple=1,",
           (BATCHING + "test_max_tokens_and_the_batch_size_multiple_set_the_training_batches",)),
    Mutant("max_tokens_valid_ignored", "--max-tokens-valid limits validation batches",
           RUN, "max_tokens=(d.max_tokens_valid or max_tokens) if valid else max_tokens", "max_tokens=max_tokens",
           (BATCHING + "test_validation_batches_have_their_own_limits",)),
    Mutant("batch_size_valid_ignored", "--batch-size-valid limits validation batches",
           RUN, "max_sentences=(d.batch_size_valid or d.batch_size) if valid else d.batch_size",
           "max_sentences=d.batch_size", (BATCHING + "test_validation_batches_have_their_own_limits",)),
    Mutant("train_subset_ignored", "--train-subset names the split trained on",
           RUN, "return self.batch_iterator(self.cfg.dataset.train_subset, epoch=epoch, shuffle=True)",
           'return self.batch_iterator("train", epoch=epoch, shuffle=True)',
           (BATCHING + "test_the_subsets_name_the_splits_trained_and_validated_on",)),
    Mutant("valid_subset_ignored", "--valid-subset names the splits validated on",
           VALIDATION, 'for subset in run.cfg.dataset.valid_subset.split(","):', 'for subset in ["valid"]:',
           (BATCHING + "test_the_subsets_name_the_splits_trained_and_validated_on",)),
    Mutant("fixed_validation_seed_ignored", "--fixed-validation-seed seeds validation",
           VALIDATION, "        torch.manual_seed(seed)\n", "        pass\n",
           (BATCHING + "test_fixed_validation_seed_is_the_random_state_validation_draws_from",)),
    Mutant("seed_ignored_for_the_model", "--seed decides the initial weights",
           "shardtrain/trainer/parallel/prepare.py", "return prepare_model(build, backend, seed=cfg.common.seed,",
           "return prepare_model(build, backend, seed=1,",
           (COMMON + "test_the_seed_decides_the_run",)),
    Mutant("scale_tolerance_ignored", "--fp16-scale-tolerance tolerates overflows", "shardtrain/trainer/precision/fp16.py",
           "tolerance=common.fp16_scale_tolerance,", "tolerance=0.0,",
           (COMMON + "test_tolerance_and_threshold_flags_reach_the_loss_scale",)),
    Mutant("threshold_loss_scale_ignored", "--threshold-loss-scale bounds the scale from below",
           "shardtrain/trainer/precision/fp16.py", "threshold=common.threshold_loss_scale,", "threshold=None,",
           (COMMON + "test_tolerance_and_threshold_flags_reach_the_loss_scale",)),
    Mutant("no_progress_bar_ignored", "--no-progress-bar logs simple lines", RUN,
           '("simple" if common.no_progress_bar else common.log_format)', "common.log_format",
           (COMMON + "test_no_progress_bar_logs_simple_lines_whatever_the_format",)),
    Mutant("bucket_cap_ignored", "--bucket-cap-mb sizes DDP's buckets", "shardtrain/trainer/parallel/ddp.py",
           "bucket_cap_mb=d.bucket_cap_mb,", "bucket_cap_mb=25,",
           (DIST + "test_ddp_flags_reach_distributed_data_parallel",)),
    Mutant("find_unused_ignored", "--find-unused-parameters allows parameters without gradients",
           "shardtrain/trainer/parallel/ddp.py", "find_unused_parameters=d.find_unused_parameters",
           "find_unused_parameters=False", (DIST + "test_ddp_flags_reach_distributed_data_parallel",)),
    Mutant("gradient_views_ignored", "--gradient-as-bucket-view makes gradients views of the buckets",
           "shardtrain/trainer/parallel/ddp.py", "gradient_as_bucket_view=d.gradient_as_bucket_view)",
           "gradient_as_bucket_view=False)", (DIST + "test_ddp_flags_reach_distributed_data_parallel",)),
    Mutant("min_params_to_wrap_ignored", "--min-params-to-wrap groups modules into FSDP units",
           "shardtrain/trainer/parallel/fully_sharded.py", "min_params_to_wrap=d.min_params_to_wrap)",
           "min_params_to_wrap=100_000_000)", (DIST + "test_min_params_to_wrap_decides_the_fsdp_units",)),
    Mutant("no_reshard_ignored", "--no-reshard-after-forward keeps the gathered parameters",
           "shardtrain/trainer/parallel/fsdp_wrap.py", "return not (distributed.no_reshard_after_forward or zero2_like)",
           "return not zero2_like",
           (DIST + "test_no_reshard_after_forward_keeps_the_gathered_parameters_for_backward",)),
    Mutant("reduce_in_low_precision_ignored", "--reduce-in-low-precision reduces in the compute dtype",
           "shardtrain/trainer/precision/choose.py",
           "return decide_dtypes(chosen(cfg.common), cfg.distributed.reduce_in_low_precision)",
           "return decide_dtypes(chosen(cfg.common), False)",
           (DIST + "test_reduce_in_low_precision_sets_the_reduction_dtype",)),
    Mutant("optimizer_name_ignored", "--optimizer NAME builds that optimizer", "shardtrain/trainer/resolved.py",
           'optimizer=slots["optimizer"].obj',
           'optimizer=resolve(type("C", (), dict(cfg.components, optimizer="adam")))["optimizer"].obj',
           (CHOICE + "test_each_optimizer_name_builds_its_optimizer",)),
    Mutant("lr_scheduler_name_ignored", "--lr-scheduler NAME shapes the learning rate",
           "shardtrain/trainer/resolved.py", 'lr_scheduler=slots["lr_scheduler"].obj',
           'lr_scheduler=resolve(type("C", (), dict(cfg.components, lr_scheduler="inverse_sqrt")))["lr_scheduler"].obj',
           (CHOICE + "test_each_scheduler_name_shapes_the_learning_rate",)),
]
