"""Every flag of shard-train that changes behaviour has a test that passes it a non-default value and
asserts the effect (benchmarks/flag_coverage.py reads their ``flag_effect`` markers), and fairseq's
flags keep the states written down here.

The states are written here, not read from shardtrain/config/fairseq_flags.TABLE: turning a REFUSED
flag into an ACCEPTED one (a silent change of results) must be a decision this file records.
"""
import importlib.util
import os
import textwrap

import pytest

from shardtrain.config.fairseq_flags import TABLE

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LM, MODEL = "task:language_modeling", "model:transformer_lm"

# fairseq 0.12.2 flags that stop the run (exit 2, one paragraph): ignoring them would change results.
REFUSED = {
    "": ("--tpu", "--quantization-config-path", "--distributed-num-procs", "--distributed-rank",
         "--fix-batches-to-gpus", "--pipeline-model-parallel", "--pipeline-balance", "--pipeline-devices",
         "--pipeline-chunks", "--pipeline-encoder-balance", "--pipeline-encoder-devices",
         "--pipeline-decoder-balance", "--pipeline-decoder-devices", "--pipeline-checkpoint",
         "--combine-valid-subsets", "--combine-val", "--grouped-shuffling",
         "--update-ordered-indices-seed", "--use-bmuf", "--skip-remainder-batch", "--continue-once"),
    LM: ("--self-target", "--past-target", "--pad-to-fixed-length", "--pad-to-fixed-bsz"),
    MODEL: ("--character-embeddings", "--scale-fc", "--scale-attn", "--scale-heads", "--scale-resids",
            "--decoder-xformers-att-config", "--decoder-layers-to-keep"),
}
# Accepted with these values only (fairseq's default, which is what shard-train does); any other is refused.
ACCEPT_ONLY = {
    ("", "--model-parallel-size"): ("1",), ("", "--ddp-comm-hook"): ("none",),
    ("", "--required-seq-len-multiple"): ("1",), ("", "--dataset-impl"): ("mmap",), ("", "--curriculum"): ("0",),
    ("", "--num-shards"): ("1",), ("", "--shard-id"): ("0",), ("", "--optimizer-overrides"): ("{}",),
    ("", "--keep-interval-updates-pattern"): ("-1",), ("", "--checkpoint-suffix"): ("",),
    ("", "--update-epoch-batch-itr"): ("False", "false", "0"),
    (LM, "--shorten-method"): ("none",), (LM, "--shorten-data-split-list"): ("",),
    (LM, "--output-dictionary-size"): ("-1",), (MODEL, "--quant-noise-pq"): ("0", "0.0"),
    (MODEL, "--quant-noise-scalar"): ("0", "0.0"), (MODEL, "--base-layers"): ("0",),
}
# Accepted with any value, with a notice: our design makes them unnecessary, so ignoring them changes nothing.
ACCEPTED = {
    "": ("--aim-repo", "--aim-run-hash", "--wandb-project", "--azureml-logging", "--on-cpu-convert-precision",
         "--empty-cache-freq", "--all-gather-list-size", "--profile", "--reset-logging", "--suppress-crashes",
         "--use-plasma-view", "--plasma-path", "--distributed-port", "--device-id", "--local_rank",
         "--distributed-no-spawn", "--fast-stat-sync", "--broadcast-buffers", "--slowmo-momentum",
         "--slowmo-base-algorithm", "--localsgd-frequency", "--nprocs-per-node", "--fp32-reduce-scatter",
         "--use-sharded-state", "--not-fsdp-flatten-parameters", "--num-workers", "--data-buffer-size",
         "--ignore-unused-valid-subsets", "--gen-subset", "--checkpoint-shard-count",
         "--load-checkpoint-on-all-dp-ranks", "--write-checkpoints-asynchronously", "--save-async",
         "--fp16-no-flatten-grads", "--skip-invalid-size-inputs-valid-test", "--bpe", "--tokenizer", "--scoring"),
    LM: ("--future-target",),
    MODEL: ("--character-filters", "--character-embedding-dim", "--char-embedder-highway-layers",
            "--quant-noise-pq-block-size", "--base-sublayers", "--base-shuffle"),
}


def _pairs(by_owner):
    return {(owner, name) for owner, names in by_owner.items() for name in names}


def table_entry(owner: str, name: str):
    """The table's entry for a written-down flag (the refusal test needs its arity and paragraph)."""
    entries = [e for e in TABLE if e.owner == owner and name in e.names]
    assert len(entries) == 1, f"{name} ({owner or 'framework'}) has {len(entries)} entries in the table"
    return entries[0]


def test_fairseq_flag_states_are_the_written_down_ones():
    table = {state: {(e.owner, n): e.values for e in TABLE if e.state == state for n in e.names}
             for state in ("refused", "accepted", "accepted_if")}
    for state, expected in (("refused", _pairs(REFUSED)), ("accepted", _pairs(ACCEPTED)),
                            ("accepted_if", set(ACCEPT_ONLY))):
        now = set(table[state])
        assert now == expected, (
            f"fairseq flags {state} now: +{sorted(now - expected)} -{sorted(expected - now)}. A state change is "
            f"a decision: update the lists in {os.path.relpath(__file__, REPO)} with it.")
    assert {key: set(values) for key, values in table["accepted_if"].items()} == \
           {key: set(values) for key, values in ACCEPT_ONLY.items()}


def _coverage_module():
    path = os.path.join(REPO, "benchmarks", "flag_coverage.py")
    spec = importlib.util.spec_from_file_location("flag_coverage", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def coverage():
    return _coverage_module()


@pytest.fixture(scope="module")
def report(coverage):
    return coverage.coverage()


# Flags that still lack a marked test, as of this list. It may only shrink: a flag that loses its last
# marked test fails below, and a flag that gains one must leave this list (the coordinator empties it).
KNOWN_GAPS = frozenset()


def test_every_behaviour_changing_flag_has_a_marked_test(report):
    missing = sorted(set(report.uncovered) - KNOWN_GAPS)
    assert not missing, (
        f"{len(missing)} flags of shard-train change behaviour and no test marked flag_effect passes them a "
        f"non-default value: {' '.join(missing)}. Mark the test that asserts the effect, or write one "
        "(python benchmarks/flag_coverage.py lists every flag and its tests).")


def test_known_gaps_are_still_gaps(report):
    closed = sorted(KNOWN_GAPS - set(report.uncovered))
    assert not closed, f"these flags have marked tests now; drop them from KNOWN_GAPS: {' '.join(closed)}"


def test_every_marker_counts(report):
    assert not report.problems, "\n".join(report.problems)


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))


def test_a_marker_whose_flag_the_module_never_passes_is_reported(coverage, tmp_path):
    flags = {name: coverage.Flag((name,), key, {"optimization"}) for name, key in (
        ("--update-freq", "optimization.update_freq"), ("--lr", "optimization.lr"),
        ("--clip-norm", "optimization.clip_norm"), ("--seed", "common.seed"), ("--cpu", "common.cpu"))}
    _write(str(tmp_path / "tests" / "helpers.py"), 'ARGV = ["--clip-norm", "0.5"]\n')
    _write(str(tmp_path / "tests" / "area" / "test_a.py"), '''
        import pytest
        from helpers import ARGV
        pytestmark = [pytest.mark.flag_effect("--clip-norm")]

        @pytest.mark.flag_effect("--update-freq", "--lr")
        def test_passes_update_freq():
            run(["--update-freq", "4", "--lr-scheduler", "fixed"])

        class TestKeys:
            @pytest.mark.flag_effect("--seed", "--no-such-flag")
            def test_by_key(self):
                run(["common.seed=3"])

        @pytest.mark.flag_effect(FLAGS[0])
        def test_not_literal():
            pass

        @pytest.mark.flag_effect("--cpu")
        def test_config_dict():
            run({"cpu": True, "cpu_count": 2})
        ''')
    report = coverage.coverage(str(tmp_path / "tests"), flags, exempt={})
    assert report.covering == {
        "--update-freq": ["tests/area/test_a.py::test_passes_update_freq"],
        "--lr": [],  # "--lr-scheduler" is another flag, and the marker's own "--lr" does not count
        "--clip-norm": ["tests/area/test_a.py"],  # module-level, the literal in an imported helper
        "--seed": ["tests/area/test_a.py::TestKeys::test_by_key"],  # its Hydra key
        "--cpu": ["tests/area/test_a.py::test_config_dict"]}  # its field name, a config dict's key
    assert report.uncovered == ["--lr"]
    assert report.problems == [
        "tests/area/test_a.py::test_passes_update_freq (line 6): marks --lr but neither it nor its key "
        "optimization.lr occurs in the module or its tests/ helpers",
        "tests/area/test_a.py::TestKeys::test_by_key (line 11): '--no-such-flag' is not a flag of shard-train (or of another "
        "command)",
        "tests/area/test_a.py::test_not_literal (line 15): flag_effect takes flags as string literals, one or more"]
