"""benchmarks/gpu/run_all.py cannot run here (no GPU), but its plumbing can: every scenario's
flags must parse and pass the compatibility checks, its assertions and figures must work
on records shaped like shard-train's, and the BENCHMARKS.md section must be replaced, not
appended, on a second run."""
import os
import sys

import pytest

from shardtrain.config.build import parse_train_args

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "gpu"))
import run_all  # noqa: E402
import runs  # noqa: E402
import scenarios  # noqa: E402


def fake_train(seen):
    def train(data_bin, workdir, name, flags, timeout=900):
        cfg = parse_train_args([data_bin, *flags])  # unknown flags and incompatible ones fail here
        updates = cfg.optimization.max_update
        inner = [{"loss": 10.0 - 0.01 * i, "wps": 1000.0, "gb_peak_alloc": 10.0, "gb_rss": 5.0,
                  **({"loss_scale": 128.0} if cfg.common.fp16 else {})} for i in range(updates)]
        seen.append(name)
        return {"records": {"train_inner": inner, "valid": [{"loss": 3.0}]}, "seconds": 1.0, "log": ""}
    return train


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return runs.learnable_data_bin(str(tmp_path_factory.mktemp("gpu-data") / "data-bin"), vocab=500, tokens=20_000)


def test_every_scenario_runs_on_fake_records(data_bin, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(scenarios, "train", fake_train(seen))
    monkeypatch.setattr(scenarios, "peak_flops", lambda: 989e12)
    monkeypatch.setattr(scenarios.torch.cuda, "device_count", lambda: 1)
    for name, scenario in scenarios.SCENARIOS.items():
        rows, results = scenario(data_bin, str(tmp_path))
        assert rows and results, name
        for result, value, target in results:
            assert target[:2] in ("<=", ">=") and value == value, (name, result)  # no NaN
    assert len(seen) == 8  # headline 3, mfu 1, precision 2, compile 2


def test_learnable_data_is_learnable(data_bin):
    from shardtrain.data.indexed_dataset import MMapIndexedDataset

    train = MMapIndexedDataset(os.path.join(data_bin, "train"))
    tokens = [int(t) for i in range(len(train)) for t in train[i][:-1]]
    successors = {}
    for a, b in zip(tokens, tokens[1:]):
        successors.setdefault(a, set()).add(b)
    assert max(len(s) for s in successors.values()) <= 4  # at most 2 bits per token to learn


def test_benchmarks_section_is_replaced_on_a_second_run(tmp_path, monkeypatch):
    (tmp_path / "BENCHMARKS.md").write_text("# Benchmarks\n\nother figures\n")
    monkeypatch.setattr(run_all, "ROOT", str(tmp_path))
    run_all.write_section("## GPU acceptance (first)")
    run_all.write_section("## GPU acceptance (second)")
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "other figures" in text and "(second)" in text and "(first)" not in text
    assert text.count(run_all.BEGIN) == 1
