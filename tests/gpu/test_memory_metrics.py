"""Memory figures on a real GPU: every record carries them, and gb_free is the
device total minus the peak allocated since the previous record (fairseq's)."""
import torch

from gpu_runs import data_bin, train
from shardtrain.trainer.metrics.meters import MetricsLogger
from shardtrain.trainer.metrics.run_metrics import RunMetrics

KEYS = {"gb_free", "gb_peak_alloc", "gb_reserved", "gb_peak_reserved", "gb_rss", "param_gb", "optim_gb"}


def _total_gib() -> float:
    return torch.cuda.mem_get_info(torch.cuda.current_device())[1] / 2**30


def test_a_short_run_logs_device_and_host_memory(tmp_path):
    inner, valid = train(data_bin(tmp_path / "data"), tmp_path / "ck", "--max-update", "4",
                         "--validate-interval-updates", "2", "--no-save")
    assert len(inner) == 4 and len(valid) == 2
    valid = [{k[len("valid_"):] if k.startswith("valid_") else k: v for k, v in r.items()} for r in valid]
    for record in inner + valid:
        assert KEYS <= set(record), record
        assert record["gb_peak_alloc"] > 0 and record["gb_free"] <= _total_gib(), record
        assert record["gb_peak_reserved"] >= record["gb_peak_alloc"] and record["gb_rss"] > 0, record


def test_a_large_allocation_lowers_gb_free_in_the_next_record_only():
    device = torch.device("cuda", torch.cuda.current_device())
    metrics, logger = RunMetrics(device), MetricsLogger()
    before = metrics.stats(logger, 1, "train_inner")
    block = torch.empty(2 * 2**30, dtype=torch.uint8, device=device)  # 2 GiB
    del block
    during = metrics.stats(logger, 2, "train_inner")
    after = metrics.stats(logger, 3, "train_inner")  # the peak was reset at the previous record
    assert during["gb_free"] <= before["gb_free"] - 1.9, (before, during)
    assert during["gb_peak_alloc"] >= 2.0 and after["gb_peak_alloc"] <= during["gb_peak_alloc"] - 1.9, (during, after)
    assert after["gb_free"] >= during["gb_free"] + 1.9, (during, after)
    assert abs(during["gb_free"] + during["gb_peak_alloc"] - _total_gib()) < 0.01, during
