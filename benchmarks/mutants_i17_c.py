"""Mutants of issue 17's helper C claims: adaptive input/softmax, adaptive_loss, the transformer_lm
presets and --decoder-layerdrop. benchmarks/mutants.py adds them to its list."""
from mutant_spec import Mutant

M = "shardtrain/models/"
ADAPTIVE = "tests/models/test_adaptive_softmax.py"
SUMS_TO_ONE = ADAPTIVE + "::test_log_probs_sum_to_one_and_loss_is_their_cross_entropy"
LAYERDROP = "tests/models/test_layerdrop.py"
RANKS = "tests/distributed/test_adaptive_layerdrop_ranks.py"

MUTANTS = [
    Mutant("adaptive_tail_without_cluster_prior", "adaptive softmax log-probabilities sum to 1 over the vocabulary",
           M + "adaptive.py", "parts.append(tail + head[:, self.cutoff[0] + index, None])", "parts.append(tail)",
           (SUMS_TO_ONE,)),
    Mutant("adaptive_head_target_not_clustered", "adaptive_loss is the cross entropy of the log-probabilities",
           M + "adaptive.py", "            head_target[rows] = self.cutoff[0] + index\n", "",
           (SUMS_TO_ONE,)),
    Mutant("adaptive_loss_tail_ignores_pad_offset", "adaptive_loss counts every tail word (fairseq drops offset pad)",
           "shardtrain/tasks/criterions.py",
           'loss = loss + F.cross_entropy(part.float(), part_target, reduction="sum")',
           'loss = loss + F.cross_entropy(part.float(), part_target, ignore_index=self.padding_idx, reduction="sum")',
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
    Mutant("layerdrop_at_eval", "no layer is dropped at evaluation",
           M + "layerdrop.py", "        if not training or self.p <= 0.0:\n", "        if self.p <= 0.0:\n",
           (LAYERDROP,)),
    Mutant("layerdrop_dropped_block_not_run", "dropped blocks get zero gradients, so every backend steps",
           M + "transformer_lm.py", "                x = x + block(x[:, :0]).sum()\n", "                continue\n",
           (LAYERDROP, RANKS)),
    # the global RNG is seeded per rank while training: drawing from it drops different blocks per rank
    Mutant("layerdrop_global_rng", "every rank drops the same blocks",
           M + "layerdrop.py", "draws = torch.rand(num_blocks, generator=self.generator)",
           "draws = torch.rand(num_blocks)", (RANKS,)),
    Mutant("relu_dropout_ignored", "--relu-dropout is fairseq's fallback for --activation-dropout",
           M + "transformer_lm.py", "activation_dropout=cfg.activation_dropout or cfg.relu_dropout,",
           "activation_dropout=cfg.activation_dropout,",
           (LAYERDROP + "::test_relu_dropout_is_fairseqs_fallback_for_activation_dropout",)),
]
