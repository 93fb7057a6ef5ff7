"""Issue 28, items 3 and 5: the budgeted GPU acceptance run, its scenarios and the data sheet's peaks;
issue 37: run_all.py's faults (bad --resume and --out, probe timeout, NaN, signals, commit, clock) and
the exact-resume check on the CPU. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

R = "tests/benchmark_scripts/test_gpu_acceptance_runner.py::"
F = "tests/benchmark_scripts/test_gpu_runner_faults.py::"
P = "tests/benchmark_scripts/test_gpu_scenarios_plumbing.py::"
PEAKS = "tests/trainer/metrics/test_gpu_peak_table.py"
RUNNER, RUN_ALL, CASES = "benchmarks/gpu/runner.py", "benchmarks/gpu/run_all.py", "benchmarks/gpu/cases.py"
SCENARIOS, FLOPS = "benchmarks/gpu/scenarios.py", "shardtrain/trainer/metrics/flops.py"
FITS = R + "test_a_case_that_does_not_fit_in_the_budget_left_is_not_started"
RESUME = R + "test_a_tier_resumes_where_the_last_stopped"
REAL = R + "test_the_real_runner_reads_pytest_and_kills_a_hanging_case_with_its_children"
I = "tests/benchmark_scripts/test_gpu_runner_inputs.py::"
T = "tests/benchmark_scripts/test_gpu_scenario_timeouts.py::"
SIGNAL = F + "test_a_signal_during_a_case_records_it_as_interrupted_and_writes_the_results"
STAMP = F + "test_the_commit_is_stamped_before_the_tree_leaves_git"

MUTANTS = [
    Mutant("gpu_budget_ignored", "a case whose estimate does not fit in the budget left is not started",
           RUNNER, "        elif case.estimate_s > left:", "        elif False:", (FITS,)),
    Mutant("gpu_cases_need_no_gpus", "2-GPU cases are listed as not run on one GPU",
           RUNNER, "        if case.gpus > gpus:", "        if False:",
           (R + "test_two_gpu_cases_are_listed_as_not_run_on_one_gpu",)),
    Mutant("gpu_case_not_in_its_own_group", "a case is killed at its timeout with the processes it started",
           RUNNER, "start_new_session=True)", "start_new_session=False)", (REAL,)),
    Mutant("gpu_timeout_not_recorded", "a case killed at its timeout is recorded as a timeout",
           RUNNER, "    if code is None:\n        outcome.status", "    if False:\n        outcome.status", (REAL,)),
    Mutant("gpu_captured_results_lost", "RESULT lines a passing test printed (captured by pytest) are kept",
           RUNNER, 'parse_results("\\n".join(printed))', "[]", (REAL,)),
    Mutant("gpu_log_records_as_figures", "figures are what the tests printed, not log records",
           RUNNER, "and not LOG_RECORD.match(line)", "and True", (REAL,)),
    Mutant("gpu_skip_passes", "a test that skips itself on a GPU node fails its case",
           RUNNER, '"skipped" if "skipped" in outcomes else "passed"', '"passed"',
           (R + "test_a_skipped_or_failed_test_makes_its_case_fail",)),
    Mutant("gpu_not_written_before_a_case", "results are on disk before and after every case",
           RUNNER, 'reason=f"started at {clock() - start:.0f} s")\n            saved()',
           'reason=f"started at {clock() - start:.0f} s")', (R + "test_results_are_on_disk_after_every_case",)),
    Mutant("gpu_budget_stop_is_a_verdict", "a case stopped at the budget's end is run again by --resume",
           RUNNER, "    if stopped_by_budget:", "    if False:",
           (R + "test_the_budgets_end_stops_a_case_which_then_has_no_verdict",)),
    Mutant("gpu_budget_stop_not_a_problem", "a case stopped at the budget's end fails the run (issue 45, 2.4)",
           "benchmarks/gpu/report.py", '"interrupted", "stopped")', '"interrupted")',
           (R + "test_the_budgets_end_stops_a_case_which_then_has_no_verdict",)),
    Mutant("gpu_resume_reruns_verdicts", "--resume does not run again a case with a verdict",
           RUN_ALL, 'todo = [c for c in catalogue if previous.get(c.name, {}).get("status") not in runner.VERDICTS]',
           "todo = list(catalogue)", (RESUME,)),
    Mutant("gpu_resume_drops_leftovers", "a tier resumes with what the last one left over",
           RUN_ALL, "(c.tier <= tier if previous else c.tier == tier)", "(c.tier == tier)", (RESUME,)),
    Mutant("gpu_killed_case_rerun", "a case running when the run was killed is recorded as interrupted",
           RUN_ALL, 'if r.get("status") == "running":', "if False:",
           (R + "test_a_case_running_or_interrupted_when_the_run_was_killed_is_run_again",)),
    Mutant("gpu_failures_exit_0", "a failed case or a missed target exits 1",
           RUN_ALL, 'return 1 if state["problems"] else 0', "return 0", (R + "test_exit_status",)),
    Mutant("gpu_no_cuda_runs_anyway", "without CUDA the run exits 2 and lists every case as not run",
           RUN_ALL, "no_cuda = run_case is None and gpus == 0", "no_cuda = False", (R + "test_exit_status",)),
    Mutant("gpu_write_benchmarks_always", "BENCHMARKS.md is written only with --write-benchmarks",
           RUN_ALL, "    if args.write_benchmarks:", "    if True:",
           (R + "test_write_benchmarks_replaces_the_section",)),
    Mutant("gpu_test_in_no_case", "every test of tests/gpu belongs to a case",
           CASES, '_t("test_memory_metrics.py")),', "()),",
           (R + "test_the_catalogue_runs_every_gpu_test_exactly_once_and_every_scenario",)),
    Mutant("gpu_tier_over_budget", "each tier fits in 480 s by its estimates",
           CASES, 'Case("precision-matrix-one-gpu", 2, 30,', 'Case("precision-matrix-one-gpu", 2, 150,',
           (R + "test_each_tier_fits_the_budget_and_tier_1_is_in_the_issues_order",)),
    Mutant("gpu_skips_not_counted", "the fp16 scenario counts the updates the loss scaler skipped",
           "benchmarks/gpu/runs.py", "        return sum(OVERFLOW_LINE in line for line in f)", "        return 0",
           (P + "test_skipped_updates_are_counted_from_what_shard_train_logs",)),
    Mutant("gpu_headline_default_schedule", "the headline's lr is real within its 30 updates",
           SCENARIOS, '"--lr-scheduler", "fixed", "--warmup-updates", "5", ', "",
           (P + "test_the_headline_lr_is_real_within_its_30_updates",)),
    Mutant("gpu_headline_mem_available", "the headline is sized by the cgroup-aware host memory",
           SCENARIOS, "from shardtrain.trainer.memory.fit import host_available_bytes",
           "host_available_bytes = lambda: int(open('/proc/meminfo').read().split('MemAvailable:')[1].split()[0])"
           " * 1024", (P + "test_the_host_memory_and_the_peak_are_shardtrains",)),
    Mutant("gpu_scenario_peak_fp32", "the MFU scenario is against the bf16 data-sheet peak",
           SCENARIOS, "get_device_name(0), torch.bfloat16, tf32=False)", "get_device_name(0), torch.float32, "
           "tf32=False)", (P + "test_the_host_memory_and_the_peak_are_shardtrains",)),
    Mutant("peak_first_match", "the most specific key wins (H100 NVL is not an SXM)",
           FLOPS, "return max(matching, key=lambda m: m[0])[1] if matching else None",
           "return matching[0][1] if matching else None", (PEAKS,)),
    Mutant("peak_substring", "keys match whole words (L4 is not in L40)",
           FLOPS, "if _words(key) <= words]", "if key.lower() in name.lower()]", (PEAKS,)),
    Mutant("gpu_runner_error_stops_the_run", "a case whose runner raises fails; the next cases still run",
           RUNNER, "            except Exception as e:  # noqa: BLE001",
           "            except ZeroDivisionError as e:  # noqa: BLE001",
           (R + "test_a_case_whose_runner_raises_fails_and_the_next_one_runs",)),
    Mutant("gpu_basetemp_parent_missing", "pytest's --basetemp parent exists (the first GPU run failed every tmp_path "
           "test without it)", RUNNER, "    os.makedirs(os.path.dirname(basetemp), exist_ok=True)\n", "", (REAL,)),
    # issue 45: inputs the mutation run found tested only in their normal form
    Mutant("gpu_empty_junit_passes", "a case whose junit holds no test fails",
           RUNNER, '"failed" if outcomes & {"failure", "error"} or not tests else',
           '"failed" if outcomes & {"failure", "error"} else', (I + "test_a_junit_that_holds_no_test_fails_its_case",)),
    Mutant("gpu_own_timeout_at_budget_is_stopped", "a timeout exactly as long as the budget left keeps its verdict",
           RUNNER, "left < case.timeout_s)", "left <= case.timeout_s)",
           (I + "test_a_timeout_exactly_as_long_as_the_budget_left_keeps_its_verdict",)),
    Mutant("gpu_pytest_exit_ignored", "pytest exiting non-zero fails the case, whatever its junit says",
           RUNNER, '    elif code != 0 and outcome.status == "passed":', "    elif False:",
           (I + "test_pytest_exiting_non_zero_beside_a_passing_junit_fails_the_case",)),
    Mutant("gpu_tier_0_accepted", "--tier outside the catalogue's tiers is refused",
           RUN_ALL, "if args.tier is not None and args.tier not in tiers:",
           "if args.tier is not None and args.tier > max(tiers):",
           (I + "test_a_tier_outside_the_catalogue_is_refused",)),
    Mutant("gpu_offload_seconds_from_ups", "the offload step ratio is from each update's wall time, not ups "
           "rounded to 2 decimals (issue 45, 2.2)", SCENARIOS,
           'seconds[when] = _mean([r["train_wall"] for r in later])',
           'seconds[when] = _mean([1.0 / r["ups"] for r in later])', (P + "test_every_scenario_runs_on_fake_records",)),
    Mutant("gpu_params_from_the_table", "offload_largest_params_billion is the built model's count (issue 45, 2.7)",
           SCENARIOS, '("offload_largest_params_billion", run["params"] / 1e9, ">=6.0")',
           '("offload_largest_params_billion", largest_offload_arch()[1] / 1e9, ">=6.0")',
           (P + "test_every_scenario_runs_on_fake_records",)),
    Mutant("gpu_params_line_unread", "the parameter count is read from shard-train's log",
           "benchmarks/gpu/runs.py", "    return counts[0] if counts else 0", "    return 6_657_048_576",
           (P + "test_skipped_updates_are_counted_from_what_shard_train_logs",)),
    Mutant("gpu_timeout_loses_scenario_figures", "a scenario killed at its timeout keeps its finished runs' figures "
           "(issue 45, 2.5)", RUNNER, 'return Outcome("timeout", seconds, f"killed at its {timeout_s:.0f} s timeout", '
           '**kept)', 'return Outcome("timeout", seconds, f"killed at its {timeout_s:.0f} s timeout")',
           (T + "test_the_runner_keeps_a_killed_or_failed_scenarios_figures",)),
    Mutant("gpu_unfinished_scenario_passes", "a scenario that exits 0 before it finished is no pass",
           RUNNER, 'if code != 0 or not done.get("finished"):', "if code != 0:",
           (T + "test_the_runner_keeps_a_killed_or_failed_scenarios_figures",)),
    Mutant("gpu_scenario_json_at_the_end", "each finished run's rows are on disk at once",
           "benchmarks/gpu/scenario_case.py", "        self.write(finished=False)", "        pass",
           (T + "test_scenario_case_writes_and_prints_each_finished_run_at_once",)),
    Mutant("gpu_train_output_held", "shard-train's output reaches run.log as it is written",
           "benchmarks/gpu/runs.py", "code = subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=timeout)",
           "code = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)",
           (T + "test_a_run_killed_at_its_timeout_has_its_output_in_the_log_already",)),
    # issue 37: run_all.py's faults
    Mutant("gpu_resume_cases_unchecked", "--resume refuses a results.json whose cases are not named records",
           RUN_ALL, "        problem = _malformed(cases)", '        problem = ""',
           (F + "test_a_resume_file_that_is_not_a_results_json_is_refused_in_one_paragraph",)),
    Mutant("gpu_out_unwritable_crashes", "an --out that cannot be written is one paragraph and exit 2",
           RUN_ALL, "    except OSError as e:\n        raise UsageError(f\"--out", "    except ValueError as e:\n"
           "        raise UsageError(f\"--out",
           (F + "test_an_out_directory_that_cannot_be_written_is_refused_before_the_probe",)),
    Mutant("gpu_probe_timeout_crashes", "a probe timeout is recorded and the results are written",
           RUN_ALL, "    except subprocess.TimeoutExpired:\n        info = {", "    except ZeroDivisionError:\n"
           "        info = {", (F + "test_a_probe_that_hangs_is_recorded_and_the_results_are_written",)),
    Mutant("gpu_budget_nan_accepted", "--budget must be finite and positive",
           RUN_ALL, "if not (math.isfinite(args.budget) and args.budget > 0):", "if args.budget <= 0:",
           (F + "test_a_budget_that_is_not_a_finite_positive_number_is_refused",)),
    Mutant("gpu_results_json_nan", "results.json is strict JSON (no NaN)",
           "benchmarks/gpu/report.py", "json.dumps(finite(plain), indent=1, default=str, allow_nan=False)",
           "json.dumps(plain, indent=1, default=str)",
           (F + "test_results_json_is_strict_json_when_a_figure_is_not_finite",)),
    Mutant("gpu_signals_not_handled", "SIGTERM/SIGINT/SIGHUP end the run with its results written",
           RUN_ALL, "    handlers = {s: signal.signal(s, _interrupt) for s in SIGNALS}", "    handlers = {}",
           (SIGNAL,)),
    Mutant("gpu_interrupted_case_unrecorded", "the case running at a signal is recorded as interrupted",
           RUN_ALL, 'for r in (r for r in state["cases"] if r["status"] == "running"):', "for r in ():", (SIGNAL,)),
    Mutant("gpu_interrupt_leaves_the_group", "a signal kills the running case's process group",
           RUNNER, "    finally:\n        _end_group(proc.pid)", "    finally:\n        pass",
           (F + "test_sigterm_kills_the_running_cases_process_group_and_writes_the_results",)),
    Mutant("gpu_interrupted_not_retried", "--resume runs an interrupted case again",
           RUNNER, 'VERDICTS = ("passed", "failed", "timeout", "skipped")',
           'VERDICTS = ("passed", "failed", "timeout", "skipped", "interrupted")',
           (R + "test_a_case_running_or_interrupted_when_the_run_was_killed_is_run_again",)),
    Mutant("gpu_commit_stamp_unread", "without .git the results name the stamped commit",
           "benchmarks/gpu/stamp_commit.py", "        with open(os.path.join(root, STAMP)) as f:",
           "        with open(os.path.join(root, STAMP + '.txt')) as f:", (STAMP,)),
    Mutant("gpu_commit_dirty_unsaid", "a stamp says when tracked files differ from the commit",
           "benchmarks/gpu/stamp_commit.py", 'return head + ("+dirty" if changed else "")', "return head", (STAMP,)),
    Mutant("gpu_budget_clock_not_main", "the budget counts from main() on the clock main() is given",
           RUN_ALL, "    start = clock() if start is None else start", "    start = time.monotonic() if start is None "
           "else start", (F + "test_the_budget_counts_from_main_not_from_the_import",)),
    # the exact-resume check itself (tests/gpu/exact_resume.py, shared with the GPU test): compared with a
    # tolerance, as rounded losses were, it passes a checkpoint of the wrong update
    Mutant("gpu_exact_resume_tolerant", "a resumed run ends with the straight run's state bit for bit",
           "tests/gpu/exact_resume.py", "                and torch.equal(x, y)",
           "                and torch.allclose(x, y, rtol=1e-3, atol=1e-3)",
           ("tests/trainer/checkpoint/test_async_save_resume_cpu.py",)),
]
