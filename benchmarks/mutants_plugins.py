"""Mutants of plugins at inference time: the plugin folder a checkpoint records, imported only when the user
names it (core/user_dir.py), and a model's optional capabilities with their defaults
(models/capabilities.py). Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

E2E = "tests/core/test_plugin_inference.py"
CAPS = "tests/models/test_capabilities.py"
DEFAULTS = CAPS + "::test_a_bare_model_gets_the_documented_defaults"
GENERATION = CAPS + "::test_generation_without_max_positions_padding_idx_or_cache"
PROBES = CAPS + "::test_every_capability_is_documented_and_probed_only_in_capabilities"
TRUST = "tests/core/test_plugin_trust.py"
CHOICE = TRUST + "::test_the_plugin_folder_a_checkpoint_is_loaded_with"
UNASKED = TRUST + "::test_a_recorded_plugin_is_imported_only_when_user_dir_names_it"
RELATIVE = TRUST + "::test_an_older_checkpoints_relative_plugin_is_never_looked_up_in_the_working_directory"
VERIFY = TRUST + "::test_shard_verify_names_the_plugin_a_checkpoint_needs"
HASHED = TRUST + "::test_the_record_hashes_the_plugins_py_files"
CHANGED = TRUST + "::test_a_named_plugin_whose_files_changed_since_the_save_loads_with_a_warning"
USER_DIR = "shardtrain/core/user_dir.py"
USER_DIR_TESTS = "tests/core/test_user_dir.py"

MUTANTS = [
    Mutant("checkpoint_records_no_plugin", "a checkpoint records the plugin's absolute path and module name",
           "shardtrain/trainer/checkpoint/contents.py", "            **user_dir.record(cfg.common.user_dir)}",
           "            }", (E2E,)),
    Mutant("config_keeps_relative_user_dir", "the config keeps --user-dir as an absolute path",
           USER_DIR, '"user_dir": import_user_dir(common["user_dir"])}}',
           '"user_dir": import_user_dir(common["user_dir"]) and common["user_dir"]}}', (E2E,)),
    Mutant("recorded_user_dir_wins", "the folder --user-dir names is the one imported",
           USER_DIR, "        return explicit\n",
           "        return path if path and os.path.isdir(path) else explicit\n", (CHOICE, E2E)),
    Mutant("inference_ignores_user_dir_flag", "shard-validate/-eval-lm/-generate/-interactive take --user-dir",
           "shardtrain/trainer/checkpoint/inference.py", "for_checkpoint(user_dir, state, path)",
           "for_checkpoint(None, state, path)", (UNASKED,)),
    Mutant("recorded_plugin_imported_unasked", "a plugin is imported only when the user names it",
           USER_DIR, "    if path is None or _installed(module):\n        return None\n",
           "    if path is None or _installed(module) or os.path.isdir(path):\n        return path\n",
           (UNASKED, CHOICE)),
    Mutant("old_relative_plugin_found_in_cwd", "an older checkpoint's relative plugin path is never looked up here",
           USER_DIR, "    if path is None or _installed(module):\n        return None\n",
           "    if path is None or _installed(module):\n        return None\n"
           "    if HEADER_KEY not in state and os.path.isdir(path):  # older checkpoints, as before\n"
           "        return path\n", (RELATIVE,)),
    Mutant("installed_plugin_matched_by_name", "an installed entry point of the recorded module provides it",
           USER_DIR, 'ep.module.split(".")[0] == module', "ep.name == module", (CHOICE,)),
    Mutant("missing_plugin_error_says_no_flag", "a refused checkpoint's paragraph names the flag to pass",
           USER_DIR, 'f"If you trust that plugin, pass --user-dir <folder> with its folder as it is on this machine "',
           'f"If you trust that plugin, pass its folder as it is on this machine "', (UNASKED,)),
    Mutant("verify_names_no_plugin", "shard-verify names the plugin a checkpoint needs",
           "shardtrain/cli/verify.py", 'return f"{found.describe()}; {plugin}" if plugin else found.describe()',
           "return found.describe()", (VERIFY,)),
    Mutant("record_without_hash", "a checkpoint records a hash of its plugin's .py files",
           USER_DIR, ', "sha256": files_sha256(path)}}', "}}", (HASHED,)),
    Mutant("hash_covers_names_only", "the plugin hash covers the .py files' contents",
           USER_DIR, 'digest.update(rel.encode() + b"\\0" + len(data).to_bytes(8, "little") + data)',
           'digest.update(rel.encode() + b"\\0")', (HASHED,)),
    Mutant("changed_plugin_not_warned", "a named plugin whose files changed since the save loads with a warning",
           USER_DIR, '(state.get(HEADER_KEY) or {}).get("sha256")', '(state.get(HEADER_KEY) or {}).get("hash")',
           (CHANGED,)),
    Mutant("model_only_drops_plugin_record", "shard-consolidate --model-only keeps the plugin record",
           "shardtrain/trainer/checkpoint/consolidate.py", '"task_fingerprint", HEADER_KEY)',
           '"task_fingerprint")', (E2E,)),
    Mutant("no_max_positions_means_no_room", "a model without max_positions is unbounded",
           "shardtrain/models/capabilities.py", "return wanted if limit is None else", "return 0 if limit is None else",
           (DEFAULTS, GENERATION)),
    Mutant("eval_lm_bounds_by_the_task", "a model without max_positions takes any --tokens-per-sample",
           "shardtrain/cli/eval_lm.py", "if limit is not None and tokens > limit:",
           "if tokens > (limit or cfg.task.tokens_per_sample):", (E2E,)),
    Mutant("generate_refuses_unbounded_prompt", "a model without max_positions takes any prompt",
           "shardtrain/cli/generate.py", "if limit is not None and len(ids) >= limit and args.max_len > 0:",
           "if len(ids) >= (limit or 0) and args.max_len > 0:", (E2E,)),
    Mutant("pad_default_ignored", "without padding_idx generation never produces the dictionary's padding",
           "shardtrain/models/capabilities.py", "return own if own is not None else dictionary_pad", "return own",
           (DEFAULTS, GENERATION)),
    Mutant("kv_cache_assumed", "a model without new_kv_cache generates by recomputing the prefix",
           "shardtrain/models/sampling.py", "    use_cache = use_cache and capabilities.has_kv_cache(model)\n",
           "", (GENERATION,)),
    Mutant("no_flops_notice", "a model without flops_per_token is said to be counted as 6 x its parameters",
           "shardtrain/trainer/metrics/flops.py", "    if not capabilities.declares_flops(model):\n",
           "    if False:\n", (E2E,)),
    Mutant("capability_probed_outside_capabilities", "capabilities are asked in one place",
           "shardtrain/trainer/parallel/prepare.py",
           "    if backend.init_on_meta and not capabilities.has_init_weights(model):",
           '    if backend.init_on_meta and not hasattr(model, "init_weights"):', (PROBES,)),
    Mutant("plugin_hash_crashes_on_a_dangling_link", "a plugin folder holding a dangling .py link still saves",
           "shardtrain/core/user_dir.py", "        except OSError:  # a dangling link", "        except KeyError:  # a dangling link",
           ("tests/core/test_plugin_trust.py::test_a_dangling_py_link_in_the_plugin_folder_is_hashed_not_a_crash",)),
    Mutant("trailing_slash_empty_module", "an older checkpoint's plugin folder ending in / names its module",
           USER_DIR, "os.path.basename(os.path.normpath(path))", "os.path.basename(path)",
           (TRUST + "::test_an_older_checkpoints_folder_ending_in_a_slash_names_its_module",)),
    Mutant("user_dir_clash_accepted", "a --user-dir named like an imported module is refused",
           USER_DIR, "        raise ConfigError(f\"--user-dir {path}: a module named {name!r} is already imported",
           "        return path\n        raise ConfigError(f\"--user-dir {path}: a module named {name!r} is already imported",
           (USER_DIR_TESTS + "::test_a_user_dir_named_like_an_imported_module_is_refused",)),
    Mutant("plugin_irregular_py_imported", "a --user-dir holding a FIFO or device .py is refused in one paragraph",
           USER_DIR, "    _refuse_irregular_files(path)\n", "",
           (USER_DIR_TESTS + "::test_a_user_dir_holding_a_fifo_or_a_device_is_refused_in_one_paragraph",)),
    Mutant("plugin_hash_reads_a_fifo", "a FIFO or device .py in the plugin folder is hashed without reading it",
           USER_DIR, "            with open_regular(full) as f:\n                data = None if f is None else f.read()",
           "            with open(full, \"rb\") as f:\n                data = f.read()",
           (TRUST + "::test_a_fifo_or_a_device_in_the_plugin_folder_is_hashed_without_reading_it",)),
    Mutant("installed_plugin_hash_unchecked", "an installed plugin that is not the recorded code loads with a warning",
           USER_DIR, "        _warn_if_installed_differs(module, recorded, checkpoint)\n",
           "        pass\n", (TRUST + "::test_an_installed_plugin_that_is_not_the_recorded_code_loads_with_a_warning",)),
    Mutant("resume_plugin_hash_unchecked", "resuming with edited plugin code warns",
           "shardtrain/trainer/checkpoint/resume.py",
           "    user_dir.warn_if_resumed_with_other_code(cfg.common.user_dir, state, path)\n", "",
           (TRUST + "::test_resuming_with_edited_plugin_code_warns",)),
    Mutant("build_model_returns_nothing", "a plugin model whose build_model returns no nn.Module is one paragraph",
           "shardtrain/tasks/base.py", "        if not isinstance(model, nn.Module):", "        if False:",
           ("tests/docs/test_plugins_doc.py::test_a_build_model_that_returns_nothing_is_one_paragraph",)),
]
