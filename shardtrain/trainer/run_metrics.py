"""What a training run logs, in fairseq's record shapes (train_inner/train/valid)."""
import time
from typing import Dict

import torch

from shardtrain.trainer.memory import state_gb
from shardtrain.trainer.meters import MetricsLogger, cuda_gb_free, resident_memory_gb


class RunMetrics:
    """The run's meters: ``inner`` resets every --log-interval, ``epoch`` every epoch."""

    def __init__(self, device: torch.device, trainer=None):
        self.device = device
        self.trainer = trainer
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
            total = out["logs"][0] if out["logs"] else {}
            ntokens, nsentences = total.get("ntokens", 0), total.get("nsentences", 0)
            m.log_speed("wps", ntokens, round=1, since=since)
            m.log_speed("ups", 1.0, round=2, since=since)
            m.log_scalar("wpb", ntokens, round=1)
            m.log_scalar("bsz", nsentences, round=1)
            m.log_scalar("lr", out["lr"], round=None)
            m.log_scalar("gnorm", out["gnorm"], round=3)
            m.log_scalar("clip", 100.0 * out["clip"], round=1)
            for key in ("loss_scale",):
                if key in out:
                    m.log_scalar(key, out[key], round=4)

    def stats(self, logger: MetricsLogger, num_updates: int) -> Dict:
        stats = dict(logger.smoothed_values())
        stats["num_updates"] = num_updates
        stats.update(self.memory())
        stats["wall"] = round(time.perf_counter() - self.start, 0)
        return stats

    def memory(self) -> Dict:
        process = ({"gb_free": round(cuda_gb_free(self.device), 1)} if self.device.type == "cuda"
                   else {"gb_rss": round(resident_memory_gb(), 2)})
        return {**process, **self.state_memory()}

    def state_memory(self) -> Dict:
        """This rank's parameter/gradient/optimizer-state GB (local shards only)."""
        return state_gb(self.trainer.params, self.trainer.optimizer) if self.trainer is not None else {}

    def state_dict(self) -> Dict:
        return {"inner": self.inner.state_dict(), "epoch": self.epoch.state_dict()}

    def load_state_dict(self, state: Dict) -> None:
        self.inner.load_state_dict(state["inner"])
        self.epoch.load_state_dict(state["epoch"])
