"""Issue 31, items 2 (Hydra half), 6 (fp16 on a CPU, unknown flags), 7 (a fast start) and 9 (fairseq flags).
Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

SW = "tests/config/test_hydra_switch.py::"
UF = "tests/cli/test_unknown_flag_and_cpu_precision.py::"
ST = "tests/cli/test_start_messages.py::"
FT = "tests/config/test_fairseq_flag_table.py::"

MUTANTS = [
    Mutant("hydra_switch_keeps_old_keys", "a recipe's optimizer switches from the command line (optimizer=adafactor)",
           "shardtrain/config/hydra_switch.py", "            for key in gone:\n                del groups[group][key]\n",
           "", (SW + "test_optimizer_switch_drops_the_old_optimizers_keys_and_keeps_the_shared_ones",)),
    Mutant("hydra_switch_drops_shared_keys", "a switch keeps the recipe's value of a key the new choice has too",
           "shardtrain/config/hydra_switch.py", "if key in old and key not in kept]", "if key in old]",
           (SW + "test_optimizer_switch_drops_the_old_optimizers_keys_and_keeps_the_shared_ones",)),
    Mutant("hydra_switch_drops_typos", "a recipe's own mistyped key is still named after a switch",
           "shardtrain/config/hydra_switch.py", "if key in old and key not in kept]", "if key not in kept]",
           (SW + "test_a_recipes_own_typo_is_not_dropped_by_a_switch",)),
    Mutant("hydra_delete_refused", "~optimizer.adam_betas gives the key its default back",
           "shardtrain/config/hydra_switch.py", "            del raw[section][key]\n            dropped.add(",
           "            dropped.add(", (SW + "test_delete_override_gives_back_the_default_and_a_typo_is_still_named",)),
    Mutant("unknown_flag_no_suggestion", "a mistyped flag gets the nearest known flag",
           "shardtrain/config/flags.py", "        if near:\n            hints.append(",
           "        if False:\n            hints.append(", (UF + "test_a_mistyped_flag_gets_the_nearest_known_flag",)),
    Mutant("fp16_cpu_silent", "--fp16 on a CPU says what it costs and suggests --bf16",
           "shardtrain/config/cpu_precision.py", "    if not on_cpu or precision == \"fp32\":",
           "    if True:", (UF + "test_fp16_on_a_cpu_says_the_cost_and_when_bf16_helps",
                            UF + "test_shard_train_prints_the_warning_before_the_run")),
    Mutant("fp16_cpu_bf16_always_suggested", "--bf16 is suggested as fast only where the CPU has bf16 instructions",
           "shardtrain/config/cpu_precision.py", "    if has_bf16:\n", "    if True:\n",
           (UF + "test_fp16_on_a_cpu_says_the_cost_and_when_bf16_helps",)),
    Mutant("help_cache_never_used", "shard-train --help is answered without importing torch",
           "shardtrain/cli/entry.py", "        if text is not None:", "        if False:",
           (ST + "test_help_is_recorded_then_answered_without_importing_the_command",
            ST + "test_cached_help_runs_with_torch_unimportable")),
    Mutant("help_cache_ignores_user_dir", "an edited plugin's flags are never described from the cache",
           "shardtrain/cli/help_cache.py", "        parts += [os.path.abspath(user_dir), *_tree(os.path.abspath(user_dir))]",
           "        parts += [os.path.abspath(user_dir)]", (ST + "test_help_key_follows_the_code_and_the_user_dir",)),
    Mutant("slow_start_silent", "every command prints its first line within 2 s",
           "shardtrain/cli/entry.py", "    timer.start()\n", "", (ST + "test_a_slow_start_says_so_and_a_fast_one_says_nothing",)),
    Mutant("start_watch_silent_while_waiting", "a multi-rank start says what it waits for while it waits",
           "shardtrain/trainer/launch/waiting.py", "                or now - self.last_line_at >= self.every_s:",
           "                and now - self.last_line_at >= self.every_s:",
           (ST + "test_start_watch_says_what_it_waits_for",)),
    Mutant("start_watch_not_polled", "a piped multi-rank start says what it waits for",
           "shardtrain/trainer/launch/start.py", "        if watching:\n            watch.poll()\n", "",
           (ST + "test_a_piped_two_rank_run_says_what_it_waits_for",)),
    Mutant("update_epoch_batch_itr_takes_no_value", "--update-epoch-batch-itr takes fairseq's value",
           "shardtrain/config/fairseq_flags.py", "    accept_only(\"--update-epoch-batch-itr\", (\"False\", \"false\", \"0\"),",
           "    accept_only(\"--update-epoch-batch-itr\", (\"False\", \"false\", \"0\", \"True\"),",
           (FT + "test_update_epoch_batch_itr_takes_fairseqs_value",)),
    Mutant("compat_flags_hidden_from_help", "accepted fairseq flags are in --help's fairseq compatibility group",
           "shardtrain/config/fairseq_compat.py", "    if entry.state == \"refused\":\n        return argparse.SUPPRESS",
           "    if True:\n        return argparse.SUPPRESS",
           (FT + "test_accepted_flags_are_in_help_in_their_own_group_and_refused_ones_are_not",)),
]
