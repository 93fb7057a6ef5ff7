"""Mutants of shardtrain/config/: flags, sections, the combination checks, the Hydra store and keys. The fairseq
flag table is in mutants_config_fairseq_flags.py, flag effects in mutants_flag_effects.py and
mutants_flag_coverage.py. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

FT = "tests/config/test_fairseq_flag_table.py::"
LISTS = "tests/optim/test_optim_epoch_lists.py"
AMP = "tests/trainer/precision/test_amp_flag.py"
HYDRA = "tests/cli/test_hydra_train.py::"
KEYS = "tests/config/test_hydra_keys.py::"
MEMO = "tests/config/test_hydra_store_memo.py::"

MUTANTS = [
    Mutant("epoch_lists_not_normalized", "one typed representation: --lr/--update-freq are lists in every config",
           "shardtrain/config/run_config.py", "        epoch_lists.normalize(cfg.optimization)\n", "",
           (LISTS + "::test_one_typed_list_from_flags_configs_and_hydra_style_values",)),
    Mutant("refused_combination_accepted", "--zero-sharding os is refused with fully_sharded",
           "shardtrain/config/checks.py",
           'c.distributed.zero_sharding != "none" and _backend_has(c, "shards_parameters")',
           'c.distributed.zero_sharding != "none" and False',
           ("tests/trainer/parallel/test_zero_decisions.py",)),
    Mutant("cpu_offload_without_fsdp_accepted", "--cpu-offload needs --ddp-backend fully_sharded",
           "shardtrain/config/checks.py",
           'c.distributed.cpu_offload and not _backend_has(c, "supports_cpu_offload")',
           'c.distributed.cpu_offload and False',
           ("tests/cli/test_bad_input.py::test_bad_train_input[cpu offload without fully_sharded]",)),
    Mutant("flag_prefixes_accepted", "unknown flags are errors; prefixes are not accepted",
           "shardtrain/config/flags.py", "allow_abbrev=False", "allow_abbrev=True",
           ("tests/config/test_config.py",)),
    Mutant("fairseq_aliases_dropped", "fairseq's alias flags (--max-sentences, --nval, --wd) work as their fields",
           "shardtrain/config/flags.py", '            group.add_argument(flag_name(f.name), *f.metadata.get("aliases", ()), **kwargs)',
           "            group.add_argument(flag_name(f.name), **kwargs)",
           ("tests/config/test_fairseq_flag_table.py::test_every_fairseq_flag_has_exactly_one_state",)),
    Mutant("hydra_bool_flag_bare", "a flag that takes no value becomes KEY=true",
           "shardtrain/config/hydra_keys.py",
           """out.append(f"{key}={value.group(1).lower() if value else 'true'}")""", "out.append(key)",
           (KEYS + "test_flags_become_keys",)),
    Mutant("hydra_alias_unknown", "fairseq's alias flags are named as their keys too",
           "shardtrain/config/hydra_keys.py", """for flag in (f"--{f.name.replace('_', '-')}", *f.metadata.get("aliases", ())):""",
           """for flag in (f"--{f.name.replace('_', '-')}",):""", (KEYS + "test_flags_become_keys",)),
    Mutant("builtin_config_not_found", "--config-name finds a built-in config with no --config-dir",
           "shardtrain/config/hydra_files.py",
           'if not os.path.isfile(os.path.join(cwd, name + ".yaml")) and name in builtin_config_names():',
           'if False:', (HYDRA + "test_builtin_config_names_and_their_precedence",)),
    Mutant("builtin_config_shadows_users", "a config file of the user's wins over a built-in of the same name",
           "shardtrain/config/hydra_files.py",
           'if not os.path.isfile(os.path.join(cwd, name + ".yaml")) and name in builtin_config_names():',
           'if name in builtin_config_names():', (HYDRA + "test_builtin_config_names_and_their_precedence",)),
    Mutant("works_flag_default_drift", "flags that work have fairseq's default",
           "shardtrain/config/sections.py", 'keep_last_epochs: int = field(-1,', 'keep_last_epochs: int = field(-2,',
           (FT + "test_works_flags_have_fairseqs_default",)),
    Mutant("amp_ignored", "--amp trains in fp16 autocast with fp32 weights and a dynamic loss scale",
           "shardtrain/trainer/precision/fp16.py", '    flags = ("fp16", "amp")', '    flags = ("fp16",)', (AMP,)),
    # -- issue 37: a command-line override wins over the recipe's value it contradicts -------------------
    Mutant("recipe_value_beats_override", "checkpoint.no_save=true on a recipe that saves every N updates runs",
           "shardtrain/config/hydra_store.py", "    return cfg, choices, primary.notes + override_wins.apply(cfg, parsed, "
           "source)\n", "    return cfg, choices, primary.notes\n",
           ("tests/config/test_override_wins.py::test_no_save_override_wins_over_the_recipes_save_interval",)),
    Mutant("override_wins_over_another_override", "two contradicting overrides are still refused",
           "shardtrain/config/override_wins.py", "        if len(won) != 1 or", "        if not won or",
           ("tests/config/test_override_wins.py::test_both_from_one_place_are_still_refused",)),
    Mutant("precision_override_loses_to_the_file", "a command-line precision wins over the config file's other one",
           "shardtrain/config/override_wins.py", "    if not won or not checks.precisions_contradict(cfg):\n",
           "    if True:\n",
           ("tests/config/test_override_wins.py::test_a_precision_override_wins_over_the_files_other_precision",)),
    # issue 45 item 4.10: a precision override wins whichever key picks it
    Mutant("precision_override_by_flag_only", "a command-line common.precision=fp16 wins over a file's bf16: true",
           "shardtrain/config/override_wins.py", "    keys = checks.precision_keys()\n",
           '    keys = [key for key in checks.precision_keys() if key != "common.precision"]\n',
           ("tests/config/test_override_wins.py::test_a_precision_by_name_override_wins_over_the_files_bf16",
            "tests/config/test_override_wins.py::test_an_fp16_override_wins_over_the_files_precision_by_name")),
    # issue 45 item 4.12: refusals name the precision flag the user typed
    Mutant("refusal_names_the_registered_flag", "a precision refusal names the flag typed, not --memory-efficient-*",
           "shardtrain/config/checks.py", "flag, dtype = _typed(cfg, kind) or flag_for(kind.name),",
           "flag, dtype = flag_for(kind.name),",
           ("tests/config/test_refusals_name_typed_flags.py::test_a_precision_picked_by_name_is_named_as_typed",)),
    Mutant("skip_nan_refusal_names_every_scaled_flag", "--skip-nan-updates under --fp16 names --fp16 alone",
           "shardtrain/config/checks.py", "{_typed(c) or _flags_of('loss_scaled')}", "{_flags_of('loss_scaled')}",
           ("tests/config/test_refusals_name_typed_flags.py::test_skip_nan_updates_under_fp16_names_fp16_alone",)),
    Mutant("hydra_store_memo_ignores_a_new_registration", "the store's nodes follow a name registered again",
           "shardtrain/config/hydra_store.py", "if built is not None and built[0] == made_from:",
           "if built is not None:", (MEMO + "test_a_second_fill_reuses_the_nodes_and_follows_a_changed_registration",)),
    Mutant("hydra_store_memo_trusts_a_changed_store", "an option the store lost is stored again",
           "shardtrain/config/hydra_store.py",
           'if last is not None and last[0] is node and store.repo.get(group, {}).get(f"{name}.yaml") is last[1]:',
           "if last is not None and last[0] is node:",
           (MEMO + "test_a_second_fill_reuses_the_nodes_and_follows_a_changed_registration",)),
    Mutant("hydra_store_memo_off", "a second fill reuses the stored nodes",
           "shardtrain/config/hydra_store.py", "    if last is not None and last[0] is node and", "    if False and",
           (MEMO + "test_a_second_fill_reuses_the_nodes_and_follows_a_changed_registration",)),
]
