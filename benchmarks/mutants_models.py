"""Mutants of shardtrain/models/: adaptive input/softmax, presets, layerdrop, sampling, beam search, FLOPs. Each
mutant was seen to fail its tests."""
from mutant_spec import Mutant

M = "shardtrain/models/"
ADAPTIVE = "tests/models/test_adaptive_softmax.py"
SUMS_TO_ONE = ADAPTIVE + "::test_log_probs_sum_to_one_and_loss_is_their_cross_entropy"
LAYERDROP = "tests/models/test_layerdrop.py"
RANKS = "tests/trainer/parallel/test_adaptive_layerdrop_ranks.py"
SAMPLING = "shardtrain/models/sampling.py"
GEN_TESTS = "tests/cli/test_generate_fairseq_lines.py"
SAMPLE_LINES = "tests/models/test_lm_sampling.py::test_sample_lines_sees_the_lines_before_it_within_the_models_positions"
MFU = "tests/trainer/metrics/test_mfu.py::"

MUTANTS = [
    Mutant("adaptive_tail_without_cluster_prior", "adaptive softmax log-probabilities sum to 1 over the vocabulary",
           M + "adaptive.py", "parts.append(tail + head[:, self.cutoff[0] + index, None])", "parts.append(tail)",
           (SUMS_TO_ONE,)),
    Mutant("adaptive_head_target_not_clustered", "adaptive_loss is the cross entropy of the log-probabilities",
           M + "adaptive.py", "            head_target[rows] = self.cutoff[0] + index\n", "",
           (SUMS_TO_ONE,)),
    Mutant("adaptive_empty_cluster_skipped", "every adaptive cluster gets a gradient (DDP without find_unused)",
           M + "adaptive.py", "            head_target[rows] = self.cutoff[0] + index\n",
           "            head_target[rows] = self.cutoff[0] + index\n            if rows.numel() == 0:\n                continue\n",
           (ADAPTIVE + "::test_every_cluster_gets_a_gradient_even_when_absent",)),
    Mutant("adaptive_proj_never_tied", "--tie-adaptive-proj shares the input bands' projections",
           M + "adaptive.py", "tie_weights, tie_weights and tie_proj\n", "tie_weights, False\n",
           (ADAPTIVE + "::test_tied_weights_are_the_adaptive_inputs",)),
    Mutant("adaptive_cutoff_past_vocab_accepted", "cutoffs beyond the vocabulary are refused with a message",
           M + "adaptive.py", "    if cutoff[-1] > vocab_size:\n", "    if cutoff[-1] > vocab_size + 100:\n",
           (ADAPTIVE + "::test_bad_adaptive_settings_are_refused",)),
    Mutant("adaptive_input_band_dims", "adaptive input band i has dim // factor**i dimensions",
           M + "adaptive.py", "    size = int(dim // factor ** band)\n", "    size = int(dim // factor ** min(band, 1))\n",
           (ADAPTIVE + "::test_adaptive_input_bands_and_init",)),
    Mutant("wiki103_preset_dropout", "transformer_lm_wiki103 resolves to fairseq's values",
           M + "architectures.py", "decoder_layers=16, decoder_attention_heads=8, dropout=0.3,",
           "decoder_layers=16, decoder_attention_heads=8, dropout=0.1,",
           ("tests/models/test_lm_arch_fairseq_values.py",)),
    Mutant("beam_search_ignores_lenpen", "beam search scores a hypothesis as fairseq: summed log-prob / length ** lenpen",
           "shardtrain/models/beam_search.py", "sum(scores) / len(scores) ** lenpen))", "sum(scores) / len(scores)))",
           (f"{GEN_TESTS}::test_beam_search_finds_distinct_hypotheses_best_first",)),
    Mutant("beam_search_scores_from_wrong_beam", "P-i has the log-prob of every hypothesis token under the model",
           "shardtrain/models/beam_search.py", "            steps = [steps[b] + [float(last[b, t])]",
           "            steps = [steps[b] + [float(last[0, t])]",
           (f"{GEN_TESTS}::test_beam_search_finds_distinct_hypotheses_best_first",)),
    Mutant("beam_search_expands_duplicate_prompts", "beam search returns distinct hypotheses",
           "shardtrain/models/beam_search.py", "        last, finished = lprobs[-1:], []\n",
           "        last, finished = lprobs[-1:].repeat(beam, 1), []\n        tokens = tokens.repeat(beam, 1)\n"
           "        summed, steps = summed.repeat(beam), [[] for _ in range(beam)]\n",
           (f"{GEN_TESTS}::test_beam_search_finds_distinct_hypotheses_best_first",)),
    Mutant("mfu_attention_uncounted", "the FLOPs per token count attention",
           "shardtrain/models/flops.py", "return 6.0 * weights + 12.0 * layers * width * seq_len",
           "return 6.0 * weights", (MFU + "test_the_models_count_is_torchs_count",)),
    Mutant("mfu_forward_only", "training FLOPs are forward and backward",
           "shardtrain/models/flops.py", "return 6.0 * weights + 12.0", "return 2.0 * weights + 12.0",
           (MFU + "test_the_formula_by_hand",)),
    Mutant("layerdrop_at_eval", "no layer is dropped at evaluation",
           M + "layerdrop.py", "        if not training or self.p <= 0.0:\n", "        if self.p <= 0.0:\n",
           (LAYERDROP,)),
    # the global RNG is seeded per rank while training: drawing from it drops different blocks per rank
    Mutant("layerdrop_global_rng", "every rank drops the same blocks",
           M + "layerdrop.py", "draws = torch.rand(num_blocks, generator=self.generator)",
           "draws = torch.rand(num_blocks)", (RANKS,)),
    Mutant("generate_prompt_not_scored", "P-i has the log-prob of every hypothesis token, prompt included",
           SAMPLING, "        scores += _log_probs(logits[:-1], temperature)", "        scores += _log_probs(logits[:0], temperature)",
           (f"{GEN_TESTS}::test_greedy_lines_are_fairseqs",)),
    Mutant("generate_prompt_scores_shifted", "P-i has the log-prob of every hypothesis token, prompt included",
           SAMPLING, "        scores += _log_probs(logits[:-1], temperature)", "        scores += _log_probs(logits[1:], temperature)",
           (f"{GEN_TESTS}::test_greedy_lines_are_fairseqs",)),
    Mutant("generate_no_forced_eos", "a hypothesis that reaches the length limit ends with eos, scored, as fairseq's",
           SAMPLING, "                if not force_eos or eos is None:\n", "                if True:\n",
           (f"{GEN_TESTS}::test_greedy_lines_are_fairseqs",)),
    Mutant("sample_lines_without_eos", "each sampled line sees the ones before it, separated as in training",
           "shardtrain/models/sampling.py", "context = torch.cat([context, line, context.new_tensor([eos])])",
           "context = torch.cat([context, line])", (SAMPLE_LINES,)),
    Mutant("sample_lines_context_uncut", "many lines fit a model of few positions",
           "shardtrain/models/sampling.py",
           "new = sample(model, context if keep is None else context[-keep:], max_line_len",
           "new = sample(model, context, max_line_len", (SAMPLE_LINES,)),
    Mutant("layerdrop_dropped_block_not_run", "dropped blocks get zero gradients, so every backend steps",
           M + "transformer_lm.py", "                x = x + block(x[:, :0]).sum()\n", "                continue\n",
           (LAYERDROP, RANKS)),
    Mutant("relu_dropout_ignored", "--relu-dropout is fairseq's fallback for --activation-dropout",
           M + "transformer_lm.py", "activation_dropout=cfg.activation_dropout or cfg.relu_dropout,",
           "activation_dropout=cfg.activation_dropout,",
           (LAYERDROP + "::test_relu_dropout_is_fairseqs_fallback_for_activation_dropout",)),
    Mutant("mfu_tied_output_uncounted", "a tied embedding's output projection is counted",
           "shardtrain/models/transformer_lm.py", "weights += self.embed_tokens.weight.numel()",
           "weights += 0", (MFU + "test_the_models_count_is_torchs_count",)),
]
