"""Issue 18: packaging, progress, plots, early checks, the demo. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

WHEEL = "tests/packaging/test_wheel.py::"
HYDRA = "tests/cli/test_hydra_train.py::"

MUTANTS = [
    Mutant("recipes_not_shipped", "the example configs ship in the wheel, reachable by name",
           "pyproject.toml", '"shardtrain.config" = ["recipes/*.yaml"]', '"shardtrain.config" = []',
           (WHEEL + "test_wheel_holds_the_package_its_data_and_metadata",)),
    Mutant("torch_range_unbounded", "the tested torch range is declared",
           "pyproject.toml", '"torch>=2.11,<2.16",', '"torch>=2.11",',
           (WHEEL + "test_wheel_holds_the_package_its_data_and_metadata",)),
    Mutant("builtin_config_not_found", "--config-name finds a built-in config with no --config-dir",
           "shardtrain/config/hydra_store.py",
           'if not os.path.isfile(os.path.join(cwd, name + ".yaml")) and name in builtin_config_names():',
           'if False:', (HYDRA + "test_builtin_config_names_and_their_precedence",)),
    Mutant("builtin_config_shadows_users", "a config file of the user's wins over a built-in of the same name",
           "shardtrain/config/hydra_store.py",
           'if not os.path.isfile(os.path.join(cwd, name + ".yaml")) and name in builtin_config_names():',
           'if name in builtin_config_names():', (HYDRA + "test_builtin_config_names_and_their_precedence",)),
]

PLOT = "tests/plot/test_plot.py::"
MUTANTS += [
    Mutant("plot_epoch_summaries_as_curve", "shard-plot draws train_inner records, not epoch summaries",
           "shardtrain/plot/records.py", '_NOT_CURVES = {"train"}', "_NOT_CURVES = set()",
           (PLOT + "test_every_log_format_reads_back",)),
    Mutant("plot_resume_keeps_first", "a resumed run's repeated updates are drawn with their later values",
           "shardtrain/plot/records.py", "grouped.setdefault((tag, metric), {})[x] = y",
           "grouped.setdefault((tag, metric), {}).setdefault(x, y)",
           (PLOT + "test_a_resumed_run_repeating_updates_keeps_the_later_values",)),
    Mutant("plot_json_prefix_kept", "json summaries' tag prefix (valid_loss) is read as the metric (loss)",
           "shardtrain/plot/records.py", 'prefix = f"{tag}_"', 'prefix = "\\0"',
           (PLOT + "test_every_log_format_reads_back",)),
    Mutant("plot_log_axis_unscaled", "ppl is drawn on a log axis consistently",
           "shardtrain/plot/svg.py", "top + h - (_scale(y, log) - ymin) / (ymax - ymin) * h",
           "top + h - (y - ymin) / (ymax - ymin) * h", (PLOT + "test_curves_are_drawn_where_their_values_are",)),
    Mutant("plot_ticks_not_nearest", "axis ticks are round values about four to a panel",
           "shardtrain/plot/svg.py", "step *= min((1, 2, 5, 10), key=lambda m: abs(math.log(step * m / raw)))",
           "step *= next(m for m in (1, 2, 5, 10) if step * m >= raw)", (PLOT + "test_ticks_are_round_and_inside",)),
]

DEMO = "tests/cli/test_demo.py::"
SAMPLING = "tests/models/test_lm_sampling.py::test_sample_lines_sees_the_lines_before_it_within_the_models_positions"
MUTANTS += [
    Mutant("sample_lines_without_eos", "each sampled line sees the ones before it, separated as in training",
           "shardtrain/models/sampling.py", "context = torch.cat([context, line, context.new_tensor([eos])])",
           "context = torch.cat([context, line])", (SAMPLING,)),
    Mutant("sample_lines_context_uncut", "many lines fit a model of few positions",
           "shardtrain/models/sampling.py", "new = sample(model, context[-keep:], max_line_len",
           "new = sample(model, context, max_line_len", (SAMPLING,)),
    Mutant("log_record_over_bar", "log records never land on a progress bar's line",
           "shardtrain/trainer/metrics/logging_setup.py", "tqdm.write(self.format(record), file=self.stream)",
           "self.stream.write(self.format(record) + self.terminator)",
           ("tests/logging/test_log_lines_and_bars.py",)),
    Mutant("demo_not_plotted", "the demo ends with a plot of its curves",
           "shardtrain/cli/demo.py", 'plot.main([os.path.join(args.workdir, LOG_FILE), "--output", curves])',
           "pass", (DEMO + "test_demo_runs_on_a_small_stdlib_corpus", DEMO + "test_both_phases_have_a_positive_limit")),
]

E2E = "tests/cli/test_cli_end_to_end.py::"
MUTANTS += [
    Mutant("valid_throughput_not_logged", "validation records carry fairseq's valid_wps, valid_wpb, valid_bsz",
           "shardtrain/trainer/loop.py", "            log_throughput(metrics, logs, since)  # valid_wps",
           "            pass  # valid_wps", (E2E + "test_checkpoint_names_keep_policy_and_validate_generate",)),
    Mutant("bsz_counts_tokens", "bsz is sentences per batch",
           "shardtrain/trainer/metrics/run_metrics.py", 'm.log_scalar("bsz", nsentences, round=1)',
           'm.log_scalar("bsz", ntokens, round=1)', (E2E + "test_checkpoint_names_keep_policy_and_validate_generate",)),
    Mutant("validate_no_bar", "shard-validate shows a bar on a terminal",
           "shardtrain/cli/validate.py", 'log_format: str = field("tqdm",', 'log_format: str = field("simple",',
           (E2E + "test_validate_and_generate_show_bars_on_a_terminal",)),
    Mutant("generate_no_bar", "shard-generate shows a bar on a terminal, on stderr",
           "shardtrain/cli/generate.py", "disable=not sys.stderr.isatty()", "disable=True",
           (E2E + "test_validate_and_generate_show_bars_on_a_terminal",)),
]

EARLY = "tests/cli/test_fail_early.py::test_refused_before_any_rank_starts_in_each_front_ends_words"
KEYS = "tests/config/test_hydra_keys.py::"
MUTANTS += [
    Mutant("no_preflight", "what components check when built is checked before any rank starts",
           "shardtrain/cli/train.py", "    preflight.check_before_launch(cfg)  # before any rank starts\n", "",
           (EARLY,)),
    Mutant("hydra_errors_name_flags", "shard-hydra-train's errors name keys, not flags",
           "shardtrain/cli/hydra_train.py", "@cli_entry(PROG, rewrite=in_keys)", "@cli_entry(PROG)",
           (EARLY, "tests/cli/test_hydra_train.py::test_mistakes_are_one_paragraph_errors")),
    Mutant("hydra_bool_flag_bare", "a flag that takes no value becomes KEY=true",
           "shardtrain/config/hydra_keys.py", 'out.append(f"{key}=true")', "out.append(key)",
           (KEYS + "test_flags_become_keys",)),
    Mutant("hydra_alias_unknown", "fairseq's alias flags are named as their keys too",
           "shardtrain/config/hydra_keys.py", """for flag in (f"--{f.name.replace('_', '-')}", *f.metadata.get("aliases", ())):""",
           """for flag in (f"--{f.name.replace('_', '-')}",):""", (KEYS + "test_flags_become_keys",)),
]

MUTANTS += [
    Mutant("slow_step_untimed", "a step that can take seconds says how long it took",
           "shardtrain/core/timing.py", '    logger.info("%s: done in %.1f s", what, time.perf_counter() - start)\n',
           "", (DEMO + "test_demo_runs_on_a_small_stdlib_corpus",)),
    Mutant("config_printed_whole", "the log shows the config compactly; the whole of it is in the save dir",
           "shardtrain/trainer/loop.py",
           'logger.info("config:\\n" + config_summary(cfg, os.path.join(cfg.checkpoint.save_dir, CONFIG_FILE)))',
           'logger.info("config:\\n" + OmegaConf.to_yaml(cfg))', (DEMO + "test_demo_runs_on_a_small_stdlib_corpus",)),
]
MUTANTS += [
    Mutant("splits_checked_in_ranks", "every split a run names is checked before any rank starts",
           "shardtrain/trainer/preflight.py", 'check_split = getattr(task, "check_split", None)', "check_split = None",
           (EARLY,)),
]
