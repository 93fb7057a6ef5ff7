"""Mutants of shardtrain/trainer/metrics/: MFU, the logged records, logging over the progress bar. Each mutant was
seen to fail its tests."""
from mutant_spec import Mutant

E2E = "tests/cli/test_cli_end_to_end.py::"
MFU = "tests/trainer/test_mfu.py::"
AMP = "tests/trainer/test_amp_flag.py::"

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
           ("tests/logging/test_log_lines_and_bars.py",)),
    Mutant("bsz_counts_tokens", "bsz is sentences per batch",
           "shardtrain/trainer/metrics/run_metrics.py", 'm.log_scalar("bsz", nsentences, round=1)',
           'm.log_scalar("bsz", ntokens, round=1)', (E2E + "test_checkpoint_names_keep_policy_and_validate_generate",)),
]
