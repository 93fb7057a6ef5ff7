"""Mutants of shard-preprocess --hf-tokenizer (shardtrain/data/hf_folder.py, hf_vocab.py): data-bins in a Hugging
Face tokenizer's own ids. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

FOLDER, VOCAB = "shardtrain/data/hf_folder.py", "shardtrain/data/hf_vocab.py"
FMT = "tests/data/test_fmt_hf_tokenizer.py::"
IDS = FMT + "test_the_ids_are_the_tokenizers_encoding_plus_eos"
DICT = FMT + "test_the_dictionary_is_the_tokenizers_vocabulary_at_its_own_ids"
LOSS = "tests/tasks/test_hf_data_bin_loss.py"
CLI = "tests/cli/test_preprocess_hf_tokenizer.py"

MUTANTS = [
    Mutant("hf_ids_offset_by_fairseq_specials", "an --hf-tokenizer data-bin's ids are the tokenizer's own",
           FOLDER, "        ids = self._tokenizer.encode(line).ids + self._eos\n",
           "        ids = [i + 4 for i in self._tokenizer.encode(line).ids] + self._eos\n", (IDS, LOSS)),
    Mutant("hf_symbols_offset_by_fairseq_specials", "symbol i of an --hf-tokenizer dictionary is the tokenizer's token i",
           VOCAB, "        symbols[idx] = token\n", "        symbols[(idx + 4) % size] = token\n", (DICT,)),
    Mutant("hf_eos_not_appended", "each line of an --hf-tokenizer data-bin ends with the model's eos",
           FOLDER, '        self._eos = [] if adds_eos else [spec["eos"]]\n', "        self._eos = []\n", (IDS, LOSS)),
    Mutant("hf_config_vocab_size_ignored", "an --hf-tokenizer data-bin has the model's vocab_size ids",
           FOLDER, '    size = config.get("vocab_size", n_tokens)\n', "    size = n_tokens\n", (DICT, LOSS)),
    Mutant("hf_pad_may_be_eos", "pad never shares an id with a real target",
           FOLDER, "    if declared is not None and declared not in (bos, eos):\n", "    if declared is not None:\n",
           (FMT + "test_pad_never_shares_an_id_with_a_real_target", LOSS)),
    Mutant("hf_pad_in_text_accepted", "a text that spells out the pad token is refused",
           FOLDER, '        if self.spec["pad"] in ids:\n', "        if False:\n",
           (FMT + "test_pad_never_shares_an_id_with_a_real_target",)),
    Mutant("hf_tokenizerless_folder_accepted", "--hf-tokenizer DIR without a tokenizer: one paragraph, exit 2",
           FOLDER, "    if not os.path.isfile(path):\n        raise DataError(f\"--hf-tokenizer {folder}: no",
           "    if False:\n        raise DataError(f\"--hf-tokenizer {folder}: no", (CLI,)),
    Mutant("hf_mismatched_vocabulary_size_accepted", "a data-bin whose vocabulary is not the model's is refused",
           FOLDER, "    if len(dictionary) != model_vocab_size:\n", "    if False:\n",
           (FMT + "test_a_mismatched_vocabulary_is_refused", LOSS)),
    Mutant("hf_other_tokenizer_accepted", "a data-bin of another tokenizer than the model folder's is refused",
           FOLDER, 'sha256_of(theirs) != spec["sha256"]:', "False:",
           (FMT + "test_a_mismatched_vocabulary_is_refused",)),
    Mutant("hf_replaced_tokenizer_json_read", "a data-bin whose tokenizer.json was replaced is refused on load",
           VOCAB, '    if sha256_of(path) != spec["sha256"]:\n', "    if False:\n",
           (FMT + "test_a_replaced_tokenizer_json_is_refused_on_load",)),
]
