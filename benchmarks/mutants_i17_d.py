"""Issue 17, helper D: mutants of the language_modeling, dataset and preprocess flags."""
from benchmarks.mutant_spec import Mutant

MUTANTS = [
    Mutant("add_bos_token_source_only", "--add-bos-token puts bos before the target too, as fairseq does",
           "shardtrain/data/token_block.py",
           '"target": self._with_bos(target)}', '"target": torch.from_numpy(target)}',
           ("tests/tasks/test_lm_add_bos_token.py",)),
    Mutant("add_bos_token_blocks_not_shortened", "with --add-bos-token a sample still fits --tokens-per-sample",
           "shardtrain/tasks/language_modeling.py",
           "self.cfg.tokens_per_sample - (bos is not None)", "self.cfg.tokens_per_sample",
           ("tests/tasks/test_lm_add_bos_token.py",)),
    Mutant("dataset_impl_lazy_accepted", "shard-preprocess refuses a --dataset-impl other than mmap",
           "shardtrain/data/preprocess.py", '(cfg.dataset_impl != "mmap",', "(False,",
           ("tests/data_format/test_fmt_preprocess_fairseq_flags.py",)),
    Mutant("max_valid_steps_ignored", "--max-valid-steps N validates on N batches",
           "shardtrain/trainer/loop.py", "itertools.islice(progress, run.cfg.dataset.max_valid_steps)",
           "progress",
           ("tests/trainer/test_valid_step_flags.py::test_max_valid_steps_limits_the_batches",)),
    Mutant("fixed_validation_seed_reseeds_training", "--fixed-validation-seed leaves training's random state alone",
           "shardtrain/trainer/loop.py", "    with torch.random.fork_rng(devices=[]):", "    if True:",
           ("tests/trainer/test_valid_step_flags.py::test_fixed_validation_seed_leaves_training_randomness_alone",)),
]
