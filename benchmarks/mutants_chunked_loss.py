"""Mutants of the chunked loss (shardtrain/tasks/chunked_loss.py, --loss-chunks) and what it asks of a model
(models/capabilities.py's output_weight, the families' features_only). Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

CHUNKED = "shardtrain/tasks/chunked_loss.py"
LOSS = "tests/tasks/test_chunked_loss.py::"
CRIT = "tests/tasks/test_chunked_criterion.py::"
EQUAL = LOSS + "test_fp32_loss_nll_and_gradients_equal_the_unchunked_loss"
PEAK = "tests/benchmark_scripts/test_chunked_loss_bench.py::test_a_small_run_and_its_result_line"
RANKS = "tests/tasks/test_chunked_loss_runs.py::test_chunked_training_equals_unchunked_on_two_ranks"
FEATURES = "features = self.kept(model(**forward_inputs(model, sample[\"net_input\"]), features_only=True))"

MUTANTS = [
    Mutant("chunked_backward_ignores_grad_output", "the chunked loss threads fp16's loss scale",
           CHUNKED, "grad = grad.mul_(grad_loss).to(features.dtype)", "grad = grad.to(features.dtype)",
           (LOSS + "test_the_incoming_gradient_scales_every_gradient",)),
    Mutant("chunked_backward_without_smoothing", "the chunked loss's gradients are label smoothing's",
           CHUNKED, "                if eps_i:\n                    grad.sub_(eps_i)\n", "", (EQUAL,)),
    Mutant("chunked_backward_ignored_rows_counted", "ignored targets get no gradient from the chunked loss",
           CHUNKED, "                grad.masked_fill_(t.eq(ctx.ignore_index)[:, None], 0.0)\n", "", (EQUAL,)),
    Mutant("chunked_last_partial_chunk_dropped", "every row is in a chunk",
           CHUNKED, "edges = [i * rows // chunks for i in range(chunks + 1)]",
           "edges = [i * (rows // chunks) for i in range(chunks + 1)]", (EQUAL,)),
    Mutant("chunked_backward_keeps_two_chunks", "one chunk's logits alive at a time, in backward",
           CHUNKED, "                del grad  # before the next chunk's logits are made\n", "", (PEAK,)),
    Mutant("chunked_forward_keeps_two_chunks", "one chunk's logits alive at a time, in forward",
           CHUNKED, "            del logits  # before the next chunk's are made: one chunk alive at a time\n", "",
           (PEAK,)),
    Mutant("chunked_under_autocast_in_fp32", "under autocast the chunks project in its dtype",
           CHUNKED, "        features, weight = features.to(dtype), weight.to(dtype)\n", "",
           (LOSS + "test_autocast_projects_in_its_dtype_as_the_unchunked_loss_does",)),
    Mutant("chunk_rule_rounds_down", "each chunk's fp32 logits stay within the budget",
           CHUNKED, "return max(1, -(-tokens // rows))", "return max(1, tokens // rows)",
           (LOSS + "test_the_rule_by_hand",)),
    Mutant("chunks_past_the_tokens_accepted", "more chunks than tokens are refused",
           CHUNKED, "    if requested > tokens:\n", "    if requested > tokens + 1:\n",
           (LOSS + "test_refusals_name_the_flag_and_the_fix",)),
    Mutant("loss_chunks_refused_only_mid_run", "--loss-chunks above the run's largest batch is refused before it starts",
           "shardtrain/trainer/preflight.py", "    if check_batch_tokens is not None and tokens is not None:",
           "    if False:", ("tests/tasks/test_chunked_loss_runs.py::test_more_chunks_than_a_batch_has_tokens_exit_2",)),
    Mutant("short_batch_chunks_not_clamped", "a batch shorter than the chunks asked for is chunked a row a chunk",
           CHUNKED, "    return min(requested, max(1, tokens))", "    return requested",
           (LOSS + "test_refusals_name_the_flag_and_the_fix",)),
    Mutant("chunked_logs_the_loss_as_nll", "the logged nll_loss is the unchunked one",
           "shardtrain/tasks/criterions.py", "{\"nll_loss\": nll.detach()} if self.returns_nll_loss",
           "{\"nll_loss\": loss.detach()} if self.returns_nll_loss",
           (CRIT + "test_chunked_equals_unchunked_through_the_criterion",)),
    Mutant("chunked_under_find_unused_parameters", "DDP finding unused parameters falls back to the whole logits",
           "shardtrain/models/capabilities.py",
           "    if any(getattr(layer, \"find_unused_parameters\", False) is True for layer in layers):\n",
           "    if False:\n", (CRIT + "test_ddp_chunks_but_not_where_it_finds_unused_parameters",)),
    Mutant("adaptive_softmax_has_an_output_weight", "a model with an adaptive softmax is never chunked",
           "shardtrain/models/transformer_lm/model.py",
           "        if self.adaptive_softmax is not None:\n            return None\n", "",
           (CRIT + "test_refusals_through_the_criterion",)),
    # the features must come through the wrapped model's forward: DDP prepares its reduction there, FSDP2 gathers
    Mutant("chunked_features_past_ddp", "chunked training under pytorch_ddp equals unchunked",
           "shardtrain/tasks/criterions.py", FEATURES,
           FEATURES.replace("self.kept(model(", "self.kept(capabilities._inner(model)("), (RANKS,)),
    Mutant("chunked_features_past_fsdp_forward", "chunked training under fully_sharded equals unchunked",
           "shardtrain/tasks/criterions.py", FEATURES,
           "features = self.kept(capabilities._inner(model).extract_features(sample[\"net_input\"][\"src_tokens\"]))",
           (RANKS,)),
    Mutant("plugin_criterion_config_read_for_loss_chunks", "a plugin criterion's own config needs no loss_chunks",
           "shardtrain/tasks/criterions.py", 'self.loss_chunks = getattr(cfg, "loss_chunks", 1)',
           "self.loss_chunks = cfg.loss_chunks",
           ("tests/trainer/checkpoint/test_best_checkpoint_metric.py::"
            "test_a_plugin_that_declares_nothing_is_trusted_with_a_warning",)),
]
