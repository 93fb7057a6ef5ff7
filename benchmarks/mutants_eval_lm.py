"""Issue 29 (data and evaluation): shard-eval-lm's --context-window, above all larger than the block it
feeds (fairseq's recipe shape). Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

EVAL = "shardtrain/cli/eval_lm.py"
TESTS = "tests/cli/test_eval_lm_perplexity.py::"
BY_HAND = TESTS + "test_a_context_window_larger_than_the_block_by_hand"
FAIRSEQ = TESTS + "test_context_windows_feed_the_rows_fairseq_feeds"

MUTANTS = [
    Mutant("eval_lm_context_from_one_block", "a context window larger than the block spans earlier blocks",
           EVAL, "            previous = rows[-1][-context:] if context else previous",
           "            previous = source[-context:] if context else previous", (BY_HAND, FAIRSEQ)),
    Mutant("eval_lm_context_capped_at_block", "each block gets up to --context-window tokens of context",
           EVAL, "            keep = min(context, len(previous))", "            keep = min(context, len(previous), len(source))",
           (BY_HAND, FAIRSEQ)),
    Mutant("eval_lm_block_not_shrunk", "blocks are --tokens-per-sample minus --context-window tokens",
           EVAL, "    return tokens - args.context_window", "    return tokens", (BY_HAND,)),
    Mutant("eval_lm_scores_from_row_start", "the scored tokens are those after the context",
           EVAL, "            span = logits[row, start:start + len(target)]", "            span = logits[row, :len(target)]",
           (BY_HAND, FAIRSEQ)),
    Mutant("eval_lm_window_equal_to_block_accepted", "a window not below --tokens-per-sample is one paragraph",
           EVAL, "    if args.context_window >= tokens:", "    if args.context_window > tokens:",
           (TESTS + "test_a_context_window_not_below_tokens_per_sample_is_one_paragraph",)),
]
