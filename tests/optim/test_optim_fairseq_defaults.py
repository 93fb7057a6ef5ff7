"""The start-up line when a fairseq-style command relies on shard-train's own default optimizer/scheduler."""
import pytest

from shardtrain.cli import train
from shardtrain.optim.fairseq_defaults import default_components_notice
from st_testutils import make_space_data_bin, tiny_model_flags


def test_notice_names_what_runs_and_the_fix():
    line = default_components_notice(["data-bin", "--optimizer", "nag", "--lr", "0.25"])
    assert line.startswith("--lr given without --lr-scheduler: shard-train runs --lr-scheduler inverse_sqrt (")
    assert "--optimizer adam" not in line and "pass --lr-scheduler fixed" in line and "\n" not in line
    line = default_components_notice(["data-bin", "--warmup-updates=10", "--lr", "1e-3"])
    assert line.startswith("--lr --warmup-updates given") and "--optimizer adam" in line
    assert default_components_notice(["data-bin", "--lr", "1e-3", "--lr-scheduler", "fixed"]) is None
    assert default_components_notice(["data-bin", "--lr-scheduler=fixed", "--warmup-updates", "5"]) is None
    assert default_components_notice(["data-bin", "--max-update", "5"]) is None  # the bare command: no notice
    assert default_components_notice(["data-bin", "--lr-shrink", "0.5"]) is not None


@pytest.mark.slow
def test_shard_train_logs_the_notice_once(tmp_path):
    data_bin = make_space_data_bin(str(tmp_path / "data"), n_words=8, train_tokens=600, valid_tokens=200)
    for name, extra, expected in (("relies", [], 1), ("explicit", ["--lr-scheduler", "inverse_sqrt"], 0)):
        log = str(tmp_path / f"{name}.log")
        train.main([data_bin, *tiny_model_flags(), "--save-dir", str(tmp_path / name), "--log-file", log,
                    "--max-update", "1", "--lr", "0.001", "--no-save", *extra])
        text = open(log).read()
        assert text.count("--lr given without --lr-scheduler: shard-train runs") == expected, text[:3000]
