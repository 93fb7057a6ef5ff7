"""Mutants of shard-demo's time budget (issue 31): the default size that fits 3 minutes, the faster final
validation, and the phase shares that say where the time went. Each mutant was seen to fail its tests."""
from mutant_spec import Mutant

FILE = "shardtrain/cli/demo.py"
DEMO = "tests/cli/test_demo.py::"

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
]
