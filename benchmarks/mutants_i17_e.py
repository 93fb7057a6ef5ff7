"""Mutants of issue 17's shard-eval-lm, shard-generate and shard-interactive claims (helper E).
benchmarks/mutants.py adds them to its list; the same rules hold (see its docstring)."""
from mutant_spec import Mutant

EVAL = "shardtrain/cli/eval_lm.py"
GEN = "shardtrain/cli/generate.py"
SAMPLING = "shardtrain/models/sampling.py"
EVAL_TESTS = "tests/cli/test_eval_lm_perplexity.py"
GEN_TESTS = "tests/cli/test_generate_fairseq_lines.py"

MUTANTS = [
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
    Mutant("generate_prompt_not_scored", "P-i has the log-prob of every hypothesis token, prompt included",
           SAMPLING, "        scores += _log_probs(logits[:-1], temperature)", "        scores += _log_probs(logits[:0], temperature)",
           (f"{GEN_TESTS}::test_greedy_lines_are_fairseqs",)),
    Mutant("generate_prompt_scores_shifted", "P-i has the log-prob of every hypothesis token, prompt included",
           SAMPLING, "        scores += _log_probs(logits[:-1], temperature)", "        scores += _log_probs(logits[1:], temperature)",
           (f"{GEN_TESTS}::test_greedy_lines_are_fairseqs",)),
    Mutant("generate_no_forced_eos", "a hypothesis that reaches the length limit ends with eos, scored, as fairseq's",
           SAMPLING, "                if not force_eos or eos is None:\n", "                if True:\n",
           (f"{GEN_TESTS}::test_greedy_lines_are_fairseqs",)),
    Mutant("generate_score_in_nats", "H-i's score is in base 2, the mean of P-i",
           GEN, "    score = positional.cumsum(0)[-1] / len(scores) / LN2 if scores",
           "    score = positional.cumsum(0)[-1] / len(scores) if scores",
           (f"{GEN_TESTS}::test_greedy_lines_are_fairseqs",)),
    Mutant("generate_nbest_worst_first", "--nbest hypotheses are printed best first",
           GEN, "        found.sort(key=lambda h: -h.score)", "        found.sort(key=lambda h: h.score)",
           (f"{GEN_TESTS}::test_nbest_samples_best_first_and_beam_draws",)),
    Mutant("interactive_stops_at_a_bad_line", "shard-interactive reports a line it cannot answer and reads on",
           "shardtrain/cli/interactive.py", "                continue\n", "                raise\n",
           (f"{GEN_TESTS}::test_interactive_answers_each_line_of_stdin",)),
]
