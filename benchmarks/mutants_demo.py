"""Mutants of shard-demo's time budget (issue 31): the default size that fits 3 minutes, the faster final
validation, and the phase shares that say where the time went. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

FILE = "shardtrain/cli/demo.py"
DEMO = "tests/e2e/test_demo.py::"
CURVES = "tests/e2e/test_demo_curves.py::test_the_demos_curves_name_the_run_and_mark_the_stop_and_resume"

MUTANTS = [
    Mutant("demo_default_500_updates", "shard-demo fits 3 minutes on 2 idle cores (240 updates)",
           FILE, "DEFAULT_MAX_UPDATE = 240", "DEFAULT_MAX_UPDATE = 500",
           (DEMO + "test_defaults_fit_three_minutes",)),
    Mutant("demo_validate_small_batches", "shard-demo validates in batches of 64 sequences",
           FILE, '"--batch-size", "64",', '"--batch-size", "16",',
           (DEMO + "test_defaults_fit_three_minutes",)),
    Mutant("demo_no_phase_shares", "shard-demo ends with each phase's share of its wall time",
           FILE, 'shares = ", ".join(f"{name} {100 * took / total:.0f}%" for name, took in self.took.items())',
           'shares = ""', (DEMO + "test_demo_runs_on_a_small_stdlib_corpus",)),
    # issue 37: the demo's curves name the run and mark its stop and resume
    Mutant("demo_curves_named_by_log_file", "shard-demo's curves name the run shard-demo, not train.log",
           FILE, '"--names", RUN_NAME, ', "", (CURVES,)),
    Mutant("demo_no_resume_mark", "shard-demo's curves mark the stop and resume",
           FILE, ', "--mark", f"{resumed_at}=stop / resume"]', "]", (CURVES,)),
]
