"""Mutants of shardtrain/config/fairseq_flags.py and fairseq_compat.py (the table of fairseq 0.12.2 flags, their
notices and refusals), the generators under tests/config/ and the default-schedule notice. Each mutant
was seen to fail its tests."""
from mutant_spec import Mutant

FT = "tests/config/test_fairseq_flag_table.py::"
MD = "tests/docs/test_fairseq_flags_readme.py::"
GEN = "tests/config/generate_flag_list.py"
TABLE = "shardtrain/config/fairseq_flags.py"
COMPAT = "shardtrain/config/fairseq_compat.py"

MUTANTS = [
    Mutant("fairseq_flag_arity_lost", "accepted flags parse with fairseq's arity (store_true takes no value)",
           COMPAT, '_NARGS = {"store_true": 0,', '_NARGS = {"store_true": None,',
           (FT + "test_accepted_flags_parse_and_say_their_notice_once",)),
    Mutant("refused_fairseq_flag_ignored", "a refused fairseq flag exits 2 with its reason and nearest equivalent",
           COMPAT, 'if entry.state == "refused" or (', 'if False or (',
           (FT + "test_refused_flags_exit_2_with_their_paragraph",)),
    Mutant("accepted_value_unchecked", "--dataset-impl mmap is accepted, any other value refused",
           COMPAT, 'and value not in entry.values)', 'and False)',
           (FT + "test_refused_flags_exit_2_with_their_paragraph",)),
    Mutant("fairseq_notice_repeated", "each accepted flag's notice is said once",
           COMPAT, "        if line not in lines:\n", "        if True:\n",
           (FT + "test_notices_print_once_on_rank_0_before_the_run",)),
    Mutant("fairseq_notice_on_every_rank", "notices are said by rank 0 only",
           COMPAT, '    if environ.get("RANK", environ.get("SLURM_PROCID", "0")) != "0":\n        return\n', "",
           (FT + "test_notices_print_once_on_rank_0_before_the_run",)),
    Mutant("fairseq_notice_on_every_torchrun_rank", "notices are said once per run under torchrun",
           COMPAT, '    if environ.get("RANK", environ.get("SLURM_PROCID", "0")) != "0":\n', '    if False:\n',
           ("tests/trainer/launch/test_fairseq_flags_torchrun.py",)),
    Mutant("unselected_component_not_named", "a flag of an unselected component names the component owning it",
           COMPAT, "        components = flag_owners(name)\n", "        components = []\n",
           (FT + "test_a_flag_of_a_component_not_selected_names_that_component",)),
    Mutant("fairseq_flag_without_state", "every fairseq 0.12.2 flag has one state: works, accepted or refused",
           TABLE, '    accept("--num-workers", "batches are read in the training process from memory-mapped '
           'files; there are no "\n           "loader workers"),\n', "",
           (FT + "test_every_fairseq_flag_has_exactly_one_state",)),
    Mutant("fairseq_flag_works_and_listed", "a flag shard-train defines is not also in the table",
           TABLE, "TABLE = (\n", 'TABLE = (\n    accept("--seed", "the seed is ignored"),\n',
           (FT + "test_every_fairseq_flag_has_exactly_one_state",)),
    Mutant("fairseq_table_arity_wrong", "the table's arity is fairseq's",
           TABLE, '    accept("--use-sharded-state", "checkpoints of fully_sharded runs are always sharded '
           'directories", FLAG),\n', '    accept("--use-sharded-state", "checkpoints of fully_sharded runs are '
           'always sharded directories"),\n',
           (FT + "test_every_table_entry_is_a_fairseq_flag_with_fairseqs_arity",)),
    Mutant("readme_fairseq_column_flag_fails", "every flag README's fairseq column names is taken by shard-train",
           TABLE, '    accept("--use-sharded-state", "checkpoints of fully_sharded runs are always sharded directories", FLAG),\n',
           "", ("tests/docs/test_readme_fairseq_column.py",)),
    Mutant("default_schedule_notice_on_explicit_scheduler", "the notice is only for commands that rely on the default",
           "shardtrain/optim/fairseq_defaults.py", '    if _given(argv, "--lr-scheduler"):\n        return None\n', "",
           ("tests/optim/test_optim_fairseq_defaults.py",)),
    Mutant("readme_table_misses_works", "README's table shows every flag's state",
           "tests/config/flag_table_markdown.py", '    return names | {"data"}  # the positional data '
           'directory\n', '    return {"data"}\n',
           (MD + "test_the_markdown_gives_every_flag_a_state",)),
    Mutant("fairseq_alias_not_generated", "the flag list names fairseq's aliases (--max-sentences, --local_rank)",
           GEN, '        if "argparse_alias" in meta:\n            entry["flags"].append(ast.literal_eval('
           'meta["argparse_alias"]))\n', "",
           (FT + "test_the_checked_in_flag_list_is_what_fairseqs_source_gives",)),
    Mutant("fairseq_interpolated_field_listed", "fields fairseq fills from another group are not flags of this one",
           GEN, "            continue  # fairseq adds this flag from the group that owns it\n", "            pass\n",
           (FT + "test_the_checked_in_flag_list_is_what_fairseqs_source_gives",)),
]
