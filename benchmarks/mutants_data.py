"""Mutants of shardtrain/data/ and shardtrain/tasks/: iterators, token blocks, preprocess, the language-modeling
task and its criterions. The data-bin's manifest and destination are in mutants_data_bin.py, --skip-batches'
windows in mutants_skip_batches.py. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

ADAPTIVE = "tests/models/test_adaptive_softmax.py"
SUMS_TO_ONE = ADAPTIVE + "::test_log_probs_sum_to_one_and_loss_is_their_cross_entropy"

MUTANTS = [
    Mutant("reshard_data_position_per_rank", "resharding: the data continues from the same global position",
           "shardtrain/data/iterators.py",
           'done = state_dict.get("global_batches_done", done * saved_shards) // self.num_shards',
           "done = done",
           ("tests/trainer/checkpoint/test_sharded_checkpoints.py::test_resume_on_any_number_of_ranks_continues_exactly",)),
    Mutant("dataset_impl_lazy_accepted", "shard-preprocess refuses a --dataset-impl other than mmap",
           "shardtrain/data/preprocess.py", '(cfg.dataset_impl != "mmap",', "(False,",
           ("tests/data/test_fmt_preprocess_fairseq_flags.py",)),
    Mutant("add_bos_token_source_only", "--add-bos-token puts bos before the target too, as fairseq does",
           "shardtrain/data/token_block.py",
           '"target": self._with_bos(target)}', '"target": torch.from_numpy(target)}',
           ("tests/tasks/test_lm_add_bos_token.py",)),
    Mutant("adaptive_loss_tail_ignores_pad_offset", "adaptive_loss counts every tail word (fairseq drops offset pad)",
           "shardtrain/tasks/criterions.py",
           'loss = loss + F.cross_entropy(part.float(), part_target, reduction="sum")',
           'loss = loss + F.cross_entropy(part.float(), part_target, ignore_index=self.padding_idx, reduction="sum")',
           (SUMS_TO_ONE,)),
    Mutant("add_bos_token_blocks_not_shortened", "with --add-bos-token a sample still fits --tokens-per-sample",
           "shardtrain/tasks/language_modeling.py",
           "self.cfg.tokens_per_sample - (bos is not None)", "self.cfg.tokens_per_sample",
           ("tests/tasks/test_lm_add_bos_token.py",)),
]
