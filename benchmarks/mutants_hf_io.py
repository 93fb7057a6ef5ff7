"""Mutants of the Hugging Face folders in and out (shardtrain/trainer/checkpoint/hf_folder.py and hf_export.py,
shardtrain/models/llama/hf_config.py, config/hf_start.py). Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

C = "shardtrain/trainer/checkpoint/"
RANKS = "tests/trainer/checkpoint/test_hf_ranks.py"
IMPORT = "tests/trainer/checkpoint/test_hf_folder.py"
EXPORT = "tests/trainer/checkpoint/test_hf_export.py"
MAPPING = "tests/models/test_hf_config.py"
RUN = "tests/trainer/checkpoint/test_hf_tokenizer_run.py"

MUTANTS = [
    Mutant("hf_rank_reads_the_whole_file", "a rank reads only its shard's rows of a Hugging Face folder",
           C + "hf_folder.py", "        with _mapped(path) as read:\n",
           "        whole = __import__('safetensors.torch').torch.load(open(path, 'rb').read())  # the file, whole\n"
           "        with _mapped(path) as read:\n",
           (RANKS + "::test_a_rank_reads_its_shard_not_the_model",)),
    Mutant("hf_rank_rows_off_by_a_chunk", "a rank fills its shard from its own rows (torch.chunk's split)",
           C + "hf_folder.py", "        begin = min(coordinate * chunk, rows)\n",
           "        begin = min((count - 1 - coordinate) * chunk, rows)\n",
           (IMPORT + "::test_the_rows_a_rank_reads_follow_torch_chunk",
            RANKS + "::test_every_backend_loads_the_folder_bit_for_bit")),
    Mutant("hf_rope_scaling_ignored", "the older rope_theta + rope_scaling spelling is read",
           "shardtrain/models/llama/hf_config.py", "        params = dict(config.get(\"rope_scaling\") or {})\n",
           "        params = {}\n",
           (MAPPING + "::test_llama_3_2_1b_in_the_older_rope_spelling",
            IMPORT + "::test_the_older_rope_spelling_loads_the_same_numbers")),
    Mutant("hf_llama3_factor_not_read", "Llama 3's RoPE factor comes from config.json",
           "shardtrain/models/llama/hf_config.py", "values.update(rope_factor=float(params[\"factor\"]),",
           "values.update(rope_factor=8.0,", (IMPORT + "::test_logits_equal_transformers_from_the_same_folder",)),
    Mutant("hf_key_map_wrong", "weights are named as Hugging Face names them",
           "shardtrain/models/llama/hf_keys.py", '"model.norm.weight": "norm.weight"', '"model.norm.weights": "norm.weight"',
           (IMPORT + "::test_logits_equal_transformers_from_the_same_folder",
            EXPORT + "::test_transformers_loads_the_export_with_our_logits_and_the_same_tensors")),
    Mutant("hf_export_without_format_metadata", "exported safetensors carry {\"format\": \"pt\"}",
           C + "hf_export.py", "                  metadata=METADATA)", "                  metadata=None)",
           (EXPORT + "::test_one_file_without_an_index_under_the_default_5gb",)),
    Mutant("hf_export_not_atomic", "--to-hf writes its folder whole or not at all",
           C + "hf_export.py", "    partial = temp_sibling(out_dir)\n    os.mkdir(partial)\n",
           "    partial = out_dir\n    os.makedirs(partial, exist_ok=True)\n",
           (EXPORT + "::test_written_whole_or_not_at_all",)),
    Mutant("hf_flag_contradiction_accepted", "a model flag contradicting config.json is refused naming both",
           "shardtrain/config/hf_start.py", "    if hf is not None:\n        _refuse_disagreement(hf, dict(cfg.model), \"the command line\")",
           "    pass", ("tests/trainer/test_hf_folder_refusals.py",)),
    Mutant("hf_shape_check_skipped", "a tensor whose shape disagrees with config.json is refused before any rank",
           C + "hf_folder.py", "            if headers[path][hf] != tuple(shapes[ours]):", "            if False:",
           ("tests/trainer/test_hf_folder_refusals.py",)),
    Mutant("hf_vocabulary_not_checked_at_launch", "a data-bin whose ids are not the folder's tokens is refused "
           "before training starts", "shardtrain/trainer/preflight.py",
           "            if check_vocabulary is not None:", "            if False:",
           (RUN + "::test_a_data_bin_whose_ids_are_not_the_folders_tokens_is_refused_before_anything_is_written",)),
    Mutant("hf_tokenizer_sha_not_compared", "a data-bin made with another tokenizer.json of the same size is refused",
           "shardtrain/data/hf_folder.py", "    if spec is None or sha256_of(theirs) != spec[\"sha256\"]:",
           "    if spec is None:",
           (RUN + "::test_a_data_bin_whose_ids_are_not_the_folders_tokens_is_refused_before_anything_is_written",)),
    Mutant("hf_folder_without_tokenizer_refused", "a folder without a tokenizer.json trains on a data-bin of its size",
           "shardtrain/data/hf_folder.py", "    if not os.path.isfile(theirs):  #", "    if False:  #",
           (RUN + "::test_a_folder_without_a_tokenizer_is_accepted_with_a_warning",)),
    Mutant("hf_export_ignores_the_data_bins_tokenizer", "a run from scratch on an HF data-bin exports its tokenizer",
           C + "hf_export.py", "    tokenizer_dir = start if has_tokenizer else (data_bin or start)",
           "    tokenizer_dir = start",
           (RUN + "::test_a_run_from_scratch_on_an_hf_data_bin_exports_the_data_bins_tokenizer_and_ids",)),
    Mutant("hf_export_drops_the_data_bins_ids", "the export's config.json has the token ids the data-bin was made "
           "with", C + "hf_export.py", "    kept = _kept_keys(start) if start else _data_bin_ids(data_bin)",
           "    kept = _kept_keys(start)",
           (RUN + "::test_a_run_from_scratch_on_an_hf_data_bin_exports_the_data_bins_tokenizer_and_ids",)),
    Mutant("hf_data_bin_without_tokenizer_config", "an HF data-bin keeps the folder's tokenizer_config.json",
           "shardtrain/data/hf_folder.py", "        if name == TOKENIZER_FILE or os.path.isfile(",
           "        if name == TOKENIZER_FILE or False and os.path.isfile(",
           (RUN + "::test_a_run_from_scratch_on_an_hf_data_bin_exports_the_data_bins_tokenizer_and_ids",)),
]
