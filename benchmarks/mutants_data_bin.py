"""Issue 29 (data and evaluation): the data-bin manifest's small files, shard-preprocess' destination
(full disk, one run at a time, replacing a data-bin said by name). Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

SMALL = "tests/data/test_fmt_manifest_small_files.py::"
DEST = "tests/cli/test_preprocess_destination.py::"
MANIFEST = "shardtrain/data/manifest.py"
PREPROCESS = "shardtrain/data/preprocess.py"
PUBLISH = "shardtrain/data/publish.py"
AT_START = SMALL + "test_a_damaged_small_file_is_refused_when_a_task_opens_the_data_bin"
UNLISTED = SMALL + "test_a_read_file_the_manifest_does_not_list_is_refused"
FULL_DISK = DEST + "test_a_full_disk_is_one_paragraph_and_leaves_the_destination_as_it_was"
REPLACED = DEST + "test_replacing_a_data_bin_is_said_by_name"

MUTANTS = [
    Mutant("data_bin_only_dict_checksummed_at_start", "a task refuses a changed spm.model, preprocess.json or .idx",
           MANIFEST, "    return _verify(path, lambda name: not name.endswith(_LARGE_SUFFIX))",
           '    return _verify(path, lambda name: name == "dict.txt")', (AT_START,)),
    Mutant("data_bin_idx_not_checksummed_at_start", "a task refuses a changed .idx (same size)",
           MANIFEST, '_LARGE_SUFFIX = ".bin"', '_LARGE_SUFFIX = (".bin", ".idx")', (AT_START,)),
    Mutant("data_bin_unlisted_spm_model_read", "a read file the manifest does not list is refused (spm.model)",
           MANIFEST, '_READ_NAMES = ("dict.txt", PREPROCESS_JSON, SPM_MODEL_FILE, TOKENIZER_FILE)',
           '_READ_NAMES = ("dict.txt", PREPROCESS_JSON, TOKENIZER_FILE)', (UNLISTED,)),
    Mutant("data_bin_unlisted_preprocess_json_read", "a read file the manifest does not list is refused (preprocess.json)",
           MANIFEST, '_READ_NAMES = ("dict.txt", PREPROCESS_JSON, SPM_MODEL_FILE, TOKENIZER_FILE)',
           '_READ_NAMES = ("dict.txt", SPM_MODEL_FILE, TOKENIZER_FILE)', (UNLISTED,)),
    Mutant("data_bin_unlisted_tokenizer_json_read", "a read file the manifest does not list is refused (tokenizer.json)",
           MANIFEST, '_READ_NAMES = ("dict.txt", PREPROCESS_JSON, SPM_MODEL_FILE, TOKENIZER_FILE)',
           '_READ_NAMES = ("dict.txt", PREPROCESS_JSON, SPM_MODEL_FILE)',
           ("tests/data/test_fmt_hf_tokenizer.py::test_the_copied_tokenizer_json_is_in_the_manifest",)),
    Mutant("data_bin_deleted_manifest_loads_unchecked", "a data-bin whose manifest was deleted is refused",
           MANIFEST, "    if recorded:", "    if False:", (SMALL + "test_a_damaged_or_deleted_manifest_is_refused",)),
    Mutant("data_bin_manifest_not_recorded", "preprocess.json records that a manifest was written",
           PREPROCESS, "    spec[RECORDS_MANIFEST] = MANIFEST", "    pass",
           (SMALL + "test_the_manifest_records_every_file_written_with_its_size_and_crc",
            SMALL + "test_a_damaged_or_deleted_manifest_is_refused")),
    Mutant("data_bin_verify_skips_bin_bytes", "shard-verify checks every byte of a .bin",
           MANIFEST, "    return _verify(path, lambda name: True)",
           '    return _verify(path, lambda name: not name.endswith(".bin"))',
           (SMALL + "test_a_bin_is_checked_by_size_at_start_and_by_bytes_in_shard_verify",)),
    Mutant("preprocess_manifest_written_after_moves", "no room for the manifest leaves the earlier data-bin whole",
           PUBLISH, "    write_manifest(staging, files)\n    mark_incomplete(destdir)\n"
                    "    for name in sorted(set(os.listdir(staging)) - {MANIFEST}):",
           "    mark_incomplete(destdir)\n    for name in sorted(set(os.listdir(staging)) - {MANIFEST}):",
           (DEST + "test_no_room_for_the_last_manifest_leaves_the_earlier_data_bin_whole",)),
    Mutant("preprocess_full_disk_traceback", "shard-preprocess onto a full disk is one paragraph",
           PREPROCESS, "        if e.errno not in NO_SPACE:", "        if True:", (FULL_DISK + "[False-1]",)),
    Mutant("preprocess_no_destdir_lock", "a second shard-preprocess into a destination is refused while the first runs",
           PREPROCESS, "        with destdir_locked(cfg.destdir):", "        with contextlib.nullcontext():",
           (DEST + "test_a_second_run_into_a_destination_is_refused_while_the_first_runs",)),
    Mutant("preprocess_lock_file_left", "a finished data-bin holds no lock file",
           "shardtrain/data/destdir_lock.py", "                os.unlink(path)", "                pass",
           (DEST + "test_a_second_run_into_a_destination_is_refused_while_the_first_runs",)),
    Mutant("preprocess_replacing_silent", "replacing a data-bin's files is said by name",
           PREPROCESS, "    if replaced:", "    if False:", (REPLACED,)),
    Mutant("preprocess_replaced_not_compared", "only the files whose content changed are named",
           PUBLISH, '                  and old.get(n, {}).get("crc32") != files[n]["crc32"])', "                  )",
           (REPLACED,)),
]
