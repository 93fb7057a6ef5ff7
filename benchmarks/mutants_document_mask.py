"""Mutants of --attn-mask-type block_causal: the task's document ids (data/collate.py, tasks/language_modeling.py),
the mask and positions of both families (models/document_mask.py, positions.py, llama/, transformer_lm/), and the
refusals (a model that cannot take document ids, before launch; a KV cache with them). Each was seen to fail its
tests."""
from mutant_spec import Mutant

M = "shardtrain/models/"
MODELS = "tests/models/test_document_mask.py::"
PACKED = MODELS + "test_a_packed_batch_is_its_documents_one_by_one"
TASK = "tests/tasks/test_lm_document_mask.py"

MUTANTS = [
    Mutant("document_positions_not_restarted", "a packed document gets the positions it would alone (fairseq's)",
           M + "transformer_lm/model.py", "else document_positions(src_tokens, self.padding_idx, document_ids))",
           "else make_positions(src_tokens, self.padding_idx, offset=past))", (PACKED,)),
    # rotary positions are relative: the loss cannot see this one, the positions the rotation is given can
    Mutant("rotary_positions_not_restarted", "a packed document's rotary positions restart at its first token",
           M + "llama/model.py", "positions = index_in_document(document_ids)  # [B, T]: cos and sin per row",
           "positions = torch.arange(src_tokens.size(1), device=src_tokens.device)",
           (MODELS + "test_llamas_rotation_restarts_at_each_document",)),
    Mutant("document_mask_causal_only", "packed documents do not see each other (SDPA's mask)",
           M + "document_mask.py", "return ((runs[:, :, None] == runs[:, None, :]) & causal)[:, None]",
           "return causal.expand(runs.size(0), 1, length, length)", (PACKED,)),
    Mutant("flex_mask_causal_only", "packed documents do not see each other (FlexAttention's mask)",
           M + "document_mask.py", "return (q >= kv) & (runs[b, q] == runs[b, kv])", "return q >= kv",
           (MODELS + "test_flex_attentions_mask_gives_what_sdpas_does_on_the_cpu",)),
    Mutant("llama_attention_ignores_the_mask", "llama's attention stays within each document",
           M + "llama/layer.py", "out = attend(q, k, v, mask, enable_gqa=gqa)",
           "out = attend(q, k, v, None, enable_gqa=gqa)", (PACKED,)),
    Mutant("flex_without_cuda", "FlexAttention only where it has a kernel and a backward (CUDA, heads of 16)",
           M + "document_mask.py", 'return device.type == "cuda" and head_dim >= FLEX_MIN_HEAD_DIM and dropout == 0.0',
           "return dropout == 0.0",
           (MODELS + "test_flex_attention_only_on_cuda_for_heads_of_16_without_attention_dropout",)),
    # torchtitan's rule: the </s> closes its document, so each line's first word is predicted from the line before
    Mutant("document_id_off_by_one", "a document starts at each </s> of the source (the token before each line)",
           "shardtrain/data/collate.py", "    return torch.cumsum(src_tokens == eos, dim=1)\n",
           "    ids = torch.zeros_like(src_tokens)\n    ids[:, 1:] = torch.cumsum(src_tokens == eos, dim=1)[:, :-1]\n"
           "    return ids\n",
           ("tests/data/test_collate.py::test_a_document_starts_at_each_eos_of_the_source", TASK)),
    Mutant("batches_without_document_ids", "--attn-mask-type block_causal gives the model document_ids",
           "shardtrain/tasks/language_modeling.py",
           "return self._with_documents(collate(samples, pad=self.dictionary.pad()))",
           "return collate(samples, pad=self.dictionary.pad())", (TASK,)),
    Mutant("dummy_batch_without_document_ids", "shard-plan and the memory check run the batch training runs",
           "shardtrain/tasks/language_modeling.py",
           "return self._with_documents(super().dummy_batch(sequences, length, device))",
           "return super().dummy_batch(sequences, length, device)",
           (TASK + "::test_block_causal_numbers_each_rows_documents",
            "tests/trainer/memory/test_meta_sizes_task_batch.py::test_a_document_mask_is_counted_once_for_every_block")),
    Mutant("document_refusal_at_the_first_step", "a model that cannot take document_ids is refused before launch",
           "shardtrain/trainer/preflight.py",
           '        forward_inputs(model, task.dummy_batch(1, 1, device="meta")["net_input"])  # refuses what it cannot take\n',
           "", ("tests/cli/test_fail_early.py::"
                "test_a_document_mask_for_a_model_that_cannot_take_one_is_refused_before_any_rank",)),
    Mutant("kv_cache_with_document_ids_accepted", "a KV cache with document_ids is refused",
           M + "document_mask.py", "    if cache is not None and document_ids is not None:\n", "    if False:\n",
           (MODELS + "test_document_ids_with_a_kv_cache_are_refused",)),
    Mutant("eval_lm_scores_without_the_mask", "shard-eval-lm scores a block_causal checkpoint per document",
           "shardtrain/cli/eval_lm.py", "        ids = documents(tokens) if documents is not None else None\n",
           "        ids = None\n", ("tests/cli/test_eval_lm_document_mask.py::test_eval_lm_scores_a_block_causal_checkpoint_per_document",)),
    Mutant("validate_ignores_attn_mask_type", "shard-validate --attn-mask-type causal scores without the mask",
           "shardtrain/cli/validate.py", "    apply_attn_mask_type(task, args.attn_mask_type)\n", "",
           ("tests/cli/test_eval_lm_document_mask.py::test_validate_masks_as_the_checkpoint_did_unless_told",)),
]
