"""Mutants of shard-eval-lm's --remove-bpe on a sentencepiece data-bin (issue 31, item 6). Each mutant was
seen to fail its tests."""
from mutant_spec import Mutant

EVAL = "shardtrain/cli/eval_lm.py"
TESTS = "tests/cli/test_eval_lm_remove_bpe.py::"

MUTANTS = [
    Mutant("eval_lm_bare_remove_bpe_is_subword_nmt", "--remove-bpe alone removes the data-bin's tokenizer's marks",
           EVAL, 'BARE_REMOVE_BPE = {"spm": "sentencepiece", "space": "subword_nmt"}',
           'BARE_REMOVE_BPE = {"spm": "subword_nmt", "space": "subword_nmt"}',
           (TESTS + "test_bare_remove_bpe_merges_sentencepiece_pieces",)),
    Mutant("eval_lm_bare_remove_bpe_ignored", "--remove-bpe alone reports the word-level perplexity",
           EVAL, "        args.post_process = bare_remove_bpe(args.data)\n", "        pass\n",
           (TESTS + "test_bare_remove_bpe_merges_sentencepiece_pieces",)),
    Mutant("eval_lm_unmarked_value_silent", "a --remove-bpe value no symbol carries says which value to pass",
           EVAL, "        check_marker(dictionary, args.post_process, marker)\n", "        pass\n",
           (TESTS + "test_an_explicit_value_does_what_fairseq_does_and_says_what_to_pass",)),
]
