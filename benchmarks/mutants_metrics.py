"""Mutants of shardtrain/trainer/metrics/: MFU, the logged records, logging over the progress bar. Each mutant was
seen to fail its tests."""
from mutant_spec import Mutant

E2E = "tests/e2e/test_cli_end_to_end.py::"
MFU = "tests/trainer/metrics/test_mfu.py::"
AMP = "tests/trainer/precision/test_amp_flag.py::"
BUSY = "tests/trainer/metrics/test_mfu_busy_machine.py::"
AXES = "tests/trainer/metrics/test_gpu_peak_axes.py::"

MUTANTS = [
    Mutant("mfu_speed_not_per_device", "tokens/s per device divide the ranks' sum by the world size",
           "shardtrain/trainer/metrics/flops.py", "per_device = wps / self.world_size", "per_device = wps",
           (AMP + "test_amp_trains_as_fp16_with_the_same_scale",)),
    Mutant("mfu_peak_draws_random_numbers", "measuring the peak leaves the run's random numbers alone",
           "shardtrain/trainer/metrics/flops.py", "a = torch.full((n, n), 0.5, device=device, dtype=dtype)",
           "a = torch.randn(n, n, device=device).to(dtype)",
           (MFU + "test_measuring_the_peak_leaves_the_runs_random_numbers_alone",)),
    Mutant("mfu_peak_ignored", "--peak-tflops is the peak mfu is against",
           "shardtrain/trainer/metrics/flops.py", "    if given is not None:\n        return given\n", "",
           (MFU + "test_train_records_carry_per_device_speed_tflops_and_mfu",)),
    Mutant("log_record_over_bar", "log records never land on a progress bar's line",
           "shardtrain/trainer/metrics/logging_setup.py", "tqdm.write(self.format(record), file=self.stream)",
           "self.stream.write(self.format(record) + self.terminator)",
           ("tests/trainer/metrics/test_log_lines_and_bars.py",)),
    Mutant("bsz_counts_tokens", "bsz is sentences per batch",
           "shardtrain/trainer/metrics/run_metrics.py", 'm.log_scalar("bsz", nsentences, round=1)',
           'm.log_scalar("bsz", ntokens, round=1)', (E2E + "test_checkpoint_names_keep_policy_and_validate_generate",)),
    # issue 37: a peak measured on a busy machine (0.000 TFLOP/s) gave mfu 371-722 in every record
    Mutant("mfu_over_100_logged", "an mfu above 100% is never logged: the field is left out, the log says why",
           "shardtrain/trainer/metrics/flops.py", "            if mfu <= 100.0:", "            if True:",
           (BUSY + "test_mfu_above_100_is_dropped_for_the_rest_of_the_run",)),
    Mutant("mfu_peak_floor_ignored", "a measured peak near zero leaves mfu out, and the log says why",
           "shardtrain/trainer/metrics/flops.py", "    if measured < MEASURED_FLOOR_TFLOPS:", "    if False:",
           (BUSY + "test_a_peak_measured_near_zero_leaves_mfu_out_and_says_why_once",)),
    Mutant("mfu_peak_one_trial", "the measured peak is the best of several matmuls",
           "shardtrain/trainer/metrics/flops.py", "    while trials < MIN_TRIALS or time.perf_counter() < deadline:",
           "    while trials < 1:", (BUSY + "test_the_measured_peak_is_the_best_of_several_trials",)),
    Mutant("mfu_peak_not_measured_again", "a peak measured below the floor is measured again after a pause",
           "shardtrain/trainer/metrics/flops.py", "    for attempt in range(MEASURE_ROUNDS):",
           "    for attempt in range(1):", (BUSY + "test_a_low_first_round_is_measured_again_after_a_pause",)),
    Mutant("peak_bf16_in_tf32_column", "a bf16 run is held against the bf16 peak when TF32 is allowed",
           "shardtrain/trainer/metrics/flops.py", '    if key == "fp32" and tf32:', "    if tf32:",
           (AXES + "test_the_table_on_every_axis",)),
    Mutant("peak_tf32_switch_ignored", "an fp32 run where torch allows TF32 is held against the TF32 peak",
           "shardtrain/trainer/metrics/flops.py",
           "return gpu_peak_tflops(torch.cuda.get_device_name(device), dtype, torch.backends.cuda.matmul.allow_tf32)",
           "return gpu_peak_tflops(torch.cuda.get_device_name(device), dtype, False)",
           (AXES + "test_a_runs_peak_on_a_named_gpu_reads_torchs_tf32_switch",)),
    # issue 45: one slow first matmul timing on a busy start dropped mfu for the whole run
    Mutant("mfu_busy_peak_not_remeasured", "a measured peak a record exceeds is measured again later in the run",
           "shardtrain/trainer/metrics/flops.py", "            if mfu > 100.0 and self.remeasures_left:",
           "            if False:",
           ("tests/trainer/metrics/test_mfu_busy_machine.py::"
            "test_a_measured_peak_a_record_exceeds_is_measured_again_later_in_the_run",)),
    Mutant("mfu_remeasure_not_wired", "a run's measured peak is measured again (Run hands Utilisation the means)",
           "shardtrain/trainer/run.py",
           "            again = remeasure(self.backend.device, dtype, cfg.common.peak_tflops)",
           "            again = None",
           ("tests/trainer/metrics/test_mfu_busy_machine.py::"
            "test_a_run_whose_first_peak_reading_was_low_has_mfu_in_its_records",)),
    Mutant("mfu_given_peak_remeasured", "--peak-tflops is not corrected by a timing",
           "shardtrain/trainer/metrics/flops.py", "    if given is not None or _listed(device, dtype) is not None:",
           "    if _listed(device, dtype) is not None:",
           ("tests/trainer/metrics/test_mfu_busy_machine.py::test_only_a_measured_peak_is_measured_again",)),
    # issue 45: a --log-file on a full disk
    Mutant("log_file_error_per_record", "a --log-file that cannot be written is said once, training goes on",
           "shardtrain/trainer/metrics/logging_setup.py", "        if not self.given_up and getattr(record, ONLY, FILE) == FILE:",
           "        if getattr(record, ONLY, FILE) == FILE:",
           ("tests/trainer/metrics/test_logging_setup.py::"
            "test_a_full_disk_under_the_log_file_is_said_once_and_training_logs_on",)),
]
