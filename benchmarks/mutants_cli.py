"""Mutants of shardtrain/cli/: the front ends of shard-train (plain, Hydra, the preflight), shard-validate,
shard-demo, shard-generate and shard-interactive. shard-eval-lm's are in mutants_eval_lm.py, the wheelhouse's in
mutants_offline_install.py. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

GEN = "shardtrain/cli/generate.py"
GEN_TESTS = "tests/cli/test_generate_fairseq_lines.py"
DEMO = "tests/e2e/test_demo.py::"
E2E = "tests/e2e/test_cli_end_to_end.py::"
EARLY = "tests/cli/test_fail_early.py::test_refused_before_any_rank_starts_in_each_front_ends_words"

MUTANTS = [
    Mutant("demo_not_plotted", "the demo ends with a plot of its curves",
           "shardtrain/cli/demo.py", "draw_curves(args.workdir, half)",
           "pass", (DEMO + "test_demo_runs_on_a_small_stdlib_corpus", DEMO + "test_both_phases_have_a_positive_limit")),
    Mutant("generate_prompt_without_bos", "shard-generate starts the prompt with bos for a --add-bos-token model",
           "shardtrain/cli/generate.py",
           '        self.lead = ([d.bos()] if getattr(cfg.task, "add_bos_token", False) else []) + [d.eos()]',
           "        self.lead = [d.eos()]",
           ("tests/tasks/test_lm_add_bos_token.py::test_generate_and_validate_agree_with_training",)),
    Mutant("generate_score_in_nats", "H-i's score is in base 2, the mean of P-i",
           GEN, "    return (torch.tensor(score, dtype=torch.float32) / LN2).item()",
           "    return (torch.tensor(score, dtype=torch.float32)).item()",
           (f"{GEN_TESTS}::test_greedy_lines_are_fairseqs",)),
    Mutant("generate_nbest_worst_first", "--nbest hypotheses are printed best first",
           GEN, "        found.sort(key=lambda h: -h.score)", "        found.sort(key=lambda h: h.score)",
           (f"{GEN_TESTS}::test_nbest_samples_best_first",)),
    Mutant("generate_no_bar", "shard-generate shows a bar on a terminal, on stderr",
           "shardtrain/cli/generate.py", "disable=not sys.stderr.isatty()", "disable=True",
           (E2E + "test_validate_and_generate_show_bars_on_a_terminal",)),
    Mutant("hydra_errors_name_flags", "shard-hydra-train's errors name keys, not flags",
           "shardtrain/cli/hydra_train.py", "@cli_entry(PROG, rewrite=in_keys)", "@cli_entry(PROG)",
           (EARLY, "tests/cli/test_hydra_train.py::test_mistakes_are_one_paragraph_errors")),
    Mutant("interactive_stops_at_a_bad_line", "shard-interactive reports a line it cannot answer and reads on",
           "shardtrain/cli/interactive.py", "            continue\n", "            raise\n",
           (f"{GEN_TESTS}::test_interactive_answers_each_line_of_stdin",)),
    Mutant("default_schedule_notice_missing", "a fairseq-style --lr without --lr-scheduler is told what runs instead",
           "shardtrain/cli/train.py", "    if notice:  # logged once", "    if False:  # logged once",
           ("tests/optim/test_optim_fairseq_defaults.py::test_shard_train_logs_the_notice_once",)),
    Mutant("no_preflight", "what components check when built is checked before any rank starts",
           "shardtrain/cli/train.py", "    preflight.check_before_launch(cfg)  # before any rank starts\n", "",
           (EARLY,)),
    Mutant("validate_no_bar", "shard-validate shows a bar on a terminal",
           "shardtrain/cli/validate.py", 'log_format: str = field("tqdm",', 'log_format: str = field("simple",',
           (E2E + "test_validate_and_generate_show_bars_on_a_terminal",)),
]
