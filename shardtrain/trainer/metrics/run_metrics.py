"""What a training run logs, in fairseq's record shapes (train_inner/train/valid)."""
import time
from typing import Dict, Optional

import torch

from shardtrain.trainer.metrics.flops import Utilisation
from shardtrain.trainer.metrics.device_memory import ROUND, MemoryCalls, PeakWindows, accelerator_memory
from shardtrain.trainer.metrics.state_memory import state_gb
from shardtrain.trainer.metrics.meters import MetricsLogger
from shardtrain.trainer.metrics.process_memory import resident_memory_gb

# Each tag's device-memory peak is over the window since that tag's previous record;
# "run" is never recorded: the whole run's peak, for run_peak_alloc_bytes().
WINDOWS = ("train_inner", "train", "valid", "run")


class RunMetrics:
    """The run's meters: ``inner`` resets every --log-interval, ``epoch`` every epoch."""

    def __init__(self, device: torch.device, trainer=None, memory_calls: Optional[MemoryCalls] = None,
                 utilisation: Optional[Utilisation] = None):
        """``memory_calls``: the device allocator's calls (tests pass stand-ins); ``utilisation``:
        adds tokens/s per device, TFLOP/s and mfu to train records."""
        self.device = device
        self.trainer = trainer
        self.utilisation = utilisation
        calls = memory_calls if memory_calls is not None else accelerator_memory(device)
        self.peaks = PeakWindows(calls, WINDOWS) if calls is not None else None
        self.start = time.perf_counter()
        self.update_started = None  # set by begin_update()
        self.inner = MetricsLogger()
        self.epoch = MetricsLogger()

    def begin_update(self) -> None:
        self.update_started = time.perf_counter()
        for m in (self.inner, self.epoch):
            m.start_timer("train_wall")

    def end_update(self) -> None:
        for m in (self.inner, self.epoch):
            m.stop_timer("train_wall")

    def log_update(self, criterion, out: Dict, num_updates: int) -> None:
        since = self.update_started  # speeds of the first window include its first update
        for m in (self.inner, self.epoch):
            criterion.reduce_metrics(out["logs"], m)
            log_throughput(m, out["logs"], since, ups=True)
            m.log_scalar("lr", out["lr"], round=None)
            m.log_scalar("gnorm", out["gnorm"], round=3)
            m.log_scalar("clip", 100.0 * out["clip"], round=1)
            for key in ("loss_scale", "rollbacks"):
                if key in out:
                    m.log_scalar(key, out[key], round=4)
            for key, value in out.get("offload", {}).items():  # trainer/offload_times.py: seconds, a percent
                m.log_scalar(key, value, round=1 if key == "offload_hidden" else 4)

    def begin_valid(self) -> None:
        """A valid record's device peak is validation's alone, not the training before it."""
        if self.peaks is not None:
            self.peaks.restart("valid")

    def stats(self, logger: MetricsLogger, num_updates: int, window: str) -> Dict:
        """``window``: "train_inner", "train" or "valid" (whose memory peak to report and restart)."""
        stats = dict(logger.smoothed_values())
        stats["num_updates"] = num_updates
        if self.utilisation is not None and window != "valid" and "wps" in stats:
            stats.update(self.utilisation.fields(stats["wps"]))
        stats.update(self.memory(window))
        stats["wall"] = round(time.perf_counter() - self.start, 0)
        return stats

    def memory(self, window: str) -> Dict:
        """Device figures (GiB; none on the CPU), host RSS (GiB; binds under --cpu-offload), state GiB."""
        device = self.peaks.record(window) if self.peaks is not None else {}
        return {**device, "gb_rss": round(resident_memory_gb(), ROUND), **self.state_memory()}

    def run_peak_alloc_bytes(self) -> Optional[int]:
        """The device's peak allocated bytes since the run began (None on the CPU).
        Every record resets the allocator's own peak, so code measuring a whole run
        reads this instead of ``torch.cuda.max_memory_allocated``."""
        return self.peaks.peak_alloc("run") if self.peaks is not None else None

    def state_memory(self) -> Dict:
        """This rank's parameter/gradient/optimizer-state GiB (local shards only)."""
        return state_gb(self.trainer.params, self.trainer.optimizer) if self.trainer is not None else {}

    def state_dict(self) -> Dict:
        return {"inner": self.inner.state_dict(), "epoch": self.epoch.state_dict()}

    def load_state_dict(self, state: Dict) -> None:
        self.inner.load_state_dict(state["inner"])
        self.epoch.load_state_dict(state["epoch"])


def log_throughput(m, logs, since: float, ups: bool = False) -> None:
    """fairseq's wps (words per second), ups (updates per second, training only), wpb (words per batch)
    and bsz (sentences per batch) of one batch's ``logs`` (summed over ranks), in fairseq's order."""
    total = logs[0] if logs else {}
    ntokens, nsentences = total.get("ntokens", 0), total.get("nsentences", 0)
    m.log_speed("wps", ntokens, round=1, since=since)
    if ups:
        m.log_speed("ups", 1.0, round=2, since=since)
    m.log_scalar("wpb", ntokens, round=1)
    m.log_scalar("bsz", nsentences, round=1)
