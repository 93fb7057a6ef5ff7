"""Mutants of shard-eval-lm (shardtrain/cli/eval_lm.py): its scores, word level, splits and --context-window,
above all larger than the block it feeds (fairseq's recipe shape). Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

EVAL = "shardtrain/cli/eval_lm.py"
TESTS = "tests/cli/test_eval_lm_perplexity.py::"
BY_HAND = TESTS + "test_a_context_window_larger_than_the_block_by_hand"
FAIRSEQ = TESTS + "test_context_windows_feed_the_rows_fairseq_feeds"
EVAL_TESTS = "tests/cli/test_eval_lm_perplexity.py"

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
    Mutant("eval_lm_context_ignored", "--context-window scores each block after up to N earlier tokens",
           EVAL, "            keep = min(context, len(previous))\n", "            keep = 0\n",
           (f"{EVAL_TESTS}::test_context_window_scores_each_block_after_its_context",)),
    Mutant("eval_lm_context_start_off_by_one", "--context-window: the context is seen, not scored",
           EVAL, "            starts.append(keep)\n", "            starts.append(max(keep - 1, 0))\n",
           (f"{EVAL_TESTS}::test_context_window_scores_each_block_after_its_context",)),
    Mutant("eval_lm_scores_the_context", "--context-window: the context is seen, not scored",
           EVAL, "            span = logits[row, start:start + len(target)]\n",
           "            span = logits[row, :len(target)]\n",
           (f"{EVAL_TESTS}::test_context_window_scores_each_block_after_its_context",)),
    Mutant("eval_lm_window_not_taken_from_block", "--context-window is taken out of --tokens-per-sample",
           EVAL, "    return tokens - args.context_window\n", "    return tokens\n",
           (f"{EVAL_TESTS}::test_context_window_does_not_raise_perplexity",)),
    Mutant("eval_lm_loss_in_nats", "shard-eval-lm's loss equals shard-validate's (base 2)",
           EVAL, "    token_loss = -total.logprob / max(total.tokens, 1) / LN2\n",
           "    token_loss = -total.logprob / max(total.tokens, 1)\n",
           (f"{EVAL_TESTS}::test_perplexity_equals_shard_validates_loss",)),
    Mutant("eval_lm_bpe_not_merged", "--remove-bpe merges subwords into words (word-level perplexity)",
           EVAL, '        joins_next = marker == "@@" and symbol.endswith(marker)\n',
           "        joins_next = False\n",
           (f"{EVAL_TESTS}::test_output_word_probs_and_word_level_perplexity",)),
    Mutant("eval_lm_softmax_batch_drops_last_chunk", "--softmax-batch changes memory, not the numbers",
           EVAL, "    for s in range(0, len(target), softmax_batch):\n",
           "    for s in range(0, len(target) - softmax_batch, softmax_batch):\n",
           (f"{EVAL_TESTS}::test_softmax_batch_changes_nothing",)),
    Mutant("eval_lm_unknown_split_unnamed", "an unknown --gen-subset is one paragraph naming --gen-subset",
           EVAL, "    check_split(args.data, args.gen_subset)\n", "",
           (f"{EVAL_TESTS}::test_bad_input_is_one_paragraph",)),
]
