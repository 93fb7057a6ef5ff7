"""Memory figures in the log records: fairseq's gb_free per record window, with
a stand-in allocator (no GPU needed), and the keys of a real CPU run."""
import pytest
import torch

from shardtrain.cli import train
from shardtrain.trainer.metrics.device_memory import GIB, MemoryCalls, PeakWindows
from shardtrain.trainer.metrics.state_memory import state_gb
from shardtrain.trainer.metrics.meters import MetricsLogger
from shardtrain.trainer.metrics.run_metrics import WINDOWS, RunMetrics
from st_testutils import json_records, make_space_data_bin, tiny_model_flags

DEVICE_KEYS = {"gb_free", "gb_peak_alloc", "gb_reserved", "gb_peak_reserved"}


class FakeAllocator:
    """A caching allocator in GiB: the peak since the last reset, and reserved
    memory that only grows (as when nothing calls empty_cache)."""

    def __init__(self, total_gib: float = 80):
        self.total, self.now, self.peak, self.held, self.peak_held, self.resets = total_gib, 0.0, 0.0, 0.0, 0.0, 0

    def use(self, gib: float) -> None:
        self.now = gib
        self.peak, self.held = max(self.peak, gib), max(self.held, gib)
        self.peak_held = max(self.peak_held, self.held)

    def reset_peak(self) -> None:
        self.resets += 1
        self.peak, self.peak_held = self.now, self.held

    def calls(self) -> MemoryCalls:
        as_bytes = lambda read: lambda: int(read() * GIB)  # noqa: E731
        return MemoryCalls(max_allocated=as_bytes(lambda: self.peak), max_reserved=as_bytes(lambda: self.peak_held),
                           reserved=as_bytes(lambda: self.held), reset_peak=self.reset_peak,
                           total=as_bytes(lambda: self.total))


def test_gb_free_is_total_minus_the_peak_since_the_previous_record():
    fake = FakeAllocator()
    peaks = PeakWindows(fake.calls(), WINDOWS)
    fake.use(30), fake.use(10)  # a spike inside the first window
    first = peaks.record("train_inner")
    assert first == {"gb_free": 50.0, "gb_peak_alloc": 30.0, "gb_reserved": 30.0, "gb_peak_reserved": 30.0}
    fake.use(15), fake.use(10)
    second = peaks.record("train_inner")
    # the first spike is behind the reset; reserved memory stays cached
    assert (second["gb_peak_alloc"], second["gb_free"], second["gb_peak_reserved"]) == (15.0, 65.0, 30.0)
    assert fake.resets == 2  # one reset per record
    fake.use(12)  # a window with no spike: its peak is what was held when it began, or more
    assert peaks.record("train_inner")["gb_peak_alloc"] == 12.0
    assert fake.resets == 3


def test_valid_shows_validation_alone_and_train_the_whole_epoch():
    fake = FakeAllocator()
    peaks = PeakWindows(fake.calls(), WINDOWS)
    fake.use(20), fake.use(5)
    assert peaks.record("train_inner")["gb_peak_alloc"] == 20.0
    fake.use(40), fake.use(5)  # training after that record, before validation starts
    peaks.restart("valid")
    fake.use(8), fake.use(5)
    assert peaks.record("valid")["gb_peak_alloc"] == 8.0
    # the reset made for validation lost nothing for the other records
    assert peaks.record("train_inner")["gb_peak_alloc"] == 40.0
    epoch = peaks.record("train")
    assert (epoch["gb_peak_alloc"], epoch["gb_free"]) == (40.0, 40.0)
    fake.use(6)
    assert peaks.record("train")["gb_peak_alloc"] == 6.0  # the next epoch starts afresh
    assert fake.resets == 6


def test_records_carry_every_memory_key_with_an_accelerator():
    fake = FakeAllocator(total_gib=16)
    metrics = RunMetrics(torch.device("cpu"), memory_calls=fake.calls())
    logger = MetricsLogger()
    logger.log_scalar("loss", 1.0)
    fake.use(2)
    stats = metrics.stats(logger, 3, "train_inner")
    assert DEVICE_KEYS | {"gb_rss", "num_updates", "wall"} <= set(stats)
    assert (stats["gb_free"], stats["gb_peak_alloc"]) == (14.0, 2.0)
    fake.use(9), fake.use(1)
    metrics.begin_valid()
    metrics.stats(logger, 3, "valid")
    assert fake.resets == 3
    # the allocator's peak was reset at each record; the run's is still known
    assert metrics.run_peak_alloc_bytes() == 9 * GIB
    assert RunMetrics(torch.device("cpu")).run_peak_alloc_bytes() is None


def test_state_figures_are_gib():
    params = [torch.nn.Parameter(torch.zeros(2**20))]  # 4 MiB: 0.0039 GiB, 0.0042 GB
    optimizer = torch.optim.SGD(params, lr=0.1)
    assert state_gb(params, optimizer)["param_gb"] == round(4 / 1024, 4)


@pytest.mark.slow
def test_cpu_run_records_host_memory_and_no_device_keys(tmp_path):
    data_bin = make_space_data_bin(str(tmp_path / "data"))
    log = str(tmp_path / "train.log")
    train.main([data_bin, *tiny_model_flags(), "--max-update", "2", "--save-dir", str(tmp_path / "ck"),
                "--no-save", "--log-file", log, "--validate-interval-updates", "2"])
    for tag in ("train_inner", "train", "valid"):
        records = json_records(log, tag)
        assert records, tag
        for record in records:  # fairseq's epoch and valid records prefix their keys: train_gb_rss
            record = {k[len(tag) + 1:] if k.startswith(tag + "_") else k: v for k, v in record.items()}
            assert {"gb_rss", "param_gb", "grad_gb", "optim_gb"} <= set(record), (tag, record)
            assert not DEVICE_KEYS & set(record), (tag, record)
            assert 0.05 < record["gb_rss"] < 64, record  # GiB: a Python process with torch, not bytes or KiB
