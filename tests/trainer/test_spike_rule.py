"""--spike-rollback's decisions, by value (shardtrain/trainer/spike.py): how the rule's running median
fills and judges, which loss it judges, what its histories hold after a rollback, how rollbacks are
counted within the horizon, and the effect of each --spike-* flag. A stand-in trainer (a one-weight
model whose weight is its update count, SGD with momentum, the real lr schedule base class) makes each
decision cheap to drive; the judged loss and the histories after a rollback are also checked on real
runs (2 gloo ranks for the loss)."""
import functools
import json
import math
import threading
import time

import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.data.batch_windows import format_windows
from shardtrain.optim.lr_scheduler.base import LRScheduler
from shardtrain.tasks.criterions import Criterion
from shardtrain.trainer.metrics.meters import MetricsLogger
from shardtrain.trainer.precision.diverged import TrainingDivergedError
from shardtrain.trainer.spike import SpikeGuard, SpikeRule
from shardtrain.trainer.checkpoint.async_staging import StepGate
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.train_state import TrainState
from st_testutils import make_space_data_bin, tiny_model_flags
import spike_mains  # noqa: E402 - beside this file

LN2 = math.log(2)
RUN = ["--lr", "0.01", "--lr-scheduler", "fixed", "--no-save", "--disable-validation", "--log-format", "none"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("spike_rule")), n_words=8, train_tokens=20000)


def run_cfg(data_bin, tmp_path, *flags):
    return parse_train_args([data_bin, *tiny_model_flags(), *RUN, "--save-dir", str(tmp_path / "ck"), *flags])


class Part:
    def __init__(self, **state):
        self.state = state

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


class Trainer:
    """What SpikeGuard snapshots and restores; ``weight`` is the update count, so a restore shows."""

    def __init__(self, lr: float = 0.1):
        self.model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(self.model.weight)  # the weight is the update count from the start
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.lr_scheduler = LRScheduler(None, self.optimizer, lr, 0)
        self.precision, self.state = Part(loss_scale=1.0), TrainState()

    @property
    def num_updates(self) -> int:
        return self.state.num_updates

    @property
    def weight(self) -> float:
        return float(self.model.weight.detach())

    def step(self) -> None:
        """A real SGD step (its momentum after k steps of gradient 1 is 1 + 0.9 + ... + 0.9 ** (k - 1))."""
        self.model.weight.grad = torch.ones_like(self.model.weight)
        self.optimizer.step()
        self.state.num_updates += 1
        with torch.no_grad():
            self.model.weight.fill_(self.state.num_updates)

    def momentum(self):
        state = self.optimizer.state.get(self.model.weight)
        return None if state is None else float(state["momentum_buffer"])


class Driver:
    """Feeds a guard one update (one batch) at a time, as loop.train_or_skip does."""

    def __init__(self, *flags: str):
        cfg = parse_train_args(["data-bin", "--spike-rollback", *flags])
        self.guard, self.trainer, self.position = SpikeGuard(cfg.optimization), Trainer(), 0
        self.guard.begin_epoch(self.trainer, 1, 0)

    def update(self, loss: float, gnorm: float = 1.0, stepped: bool = True) -> bool:
        """One update whose logged loss is ``loss`` (base 2); True when it rolled back."""
        if stepped:
            self.trainer.step()
        self.position += 1
        out = {"logs": [{"loss": loss * 8.0 * LN2}], "sample_size": 8.0, "gnorm": gnorm, "stepped": stepped}
        return self.guard.after_update(self.trainer, out, 1, self.position)

    def history(self, rule: int = 0):
        return list(self.guard.rules[rule].history)


def test_nothing_but_nan_is_judged_until_the_window_is_full():
    rule = SpikeRule(factor=2.0, window=4)
    assert [rule.judge(v) for v in (1.0, 100.0, 1.0)] == [None] * 3  # 100 > 2 x anything: not judged yet
    assert "nan" in rule.judge(math.nan) and list(rule.history) == [1.0, 100.0, 1.0]  # NaN never joins
    assert rule.judge(1.0) is None and list(rule.history) == [1.0, 100.0, 1.0, 1.0]  # full now
    assert rule.judge(2.01) is not None  # the median is 1.0


def test_the_median_of_exactly_the_last_window_values_and_the_factor_boundary():
    rule = SpikeRule(factor=2.0, window=4)
    for v in (1.0, 2.0, 4.0, 100.0):
        assert rule.judge(v) is None
    # median of 1, 2, 4, 100 = 3 (the mean of the middle two; the lower one, 2, or the upper, 4, would not be)
    reason = rule.judge(6.001)
    assert reason == ("the loss 6.001 is above 2 x 3, the median of the last 4 updates (--spike-factor)")
    assert list(rule.history) == [1.0, 2.0, 4.0, 100.0]  # the spike did not join
    assert rule.judge(6.0) is None  # exactly the factor x the median: no spike
    assert list(rule.history) == [2.0, 4.0, 100.0, 6.0]  # the oldest value left: median now 5
    assert rule.judge(10.001) is not None and rule.judge(10.0) is None


@pytest.mark.flag_effect("--spike-factor", "--spike-window")
def test_the_guard_judges_with_the_flags_values():
    d = Driver("--spike-factor", "1.5", "--spike-window", "2")
    assert [d.update(v) for v in (2.0, 4.0)] == [False, False]  # the median of 2 values: 3
    assert d.update(4.5) is False and d.history() == [4.0, 4.5]  # 4.5 = 1.5 x 3: not above
    assert d.update(6.376) is True  # above 1.5 x 4.25
    d = Driver("--spike-factor", "1.5", "--spike-window", "3")
    assert [d.update(v) for v in (2.0, 4.0, 100.0)] == [False] * 3 and d.update(6.1) is True  # 1.5 x 4


def test_the_judged_loss_is_the_logged_sample_size_weighted_mean():
    """Two batches (or ranks) of sample sizes 1 and 3, summed losses 2 and 10 bits: the run logs
    12 / 4 = 3 bits (the mean of the batches' means would be 2.67); the guard judges 3."""
    batches = [{"loss": 2.0 * LN2, "sample_size": 1, "ntokens": 1},
               {"loss": 10.0 * LN2, "sample_size": 3, "ntokens": 3}]
    logged = MetricsLogger()
    Criterion.reduce_metrics(batches, logged)
    assert logged.smoothed_values()["loss"] == 3.0
    cfg = parse_train_args(["data-bin", "--spike-rollback"])
    guard, trainer = SpikeGuard(cfg.optimization), Trainer()
    guard.begin_epoch(trainer, 1, 0)
    out = {"logs": [{"loss": 12.0 * LN2}], "sample_size": 4.0, "gnorm": 1.0, "stepped": True}  # the summed logs
    assert guard.after_update(trainer, out, 1, 1) is False
    assert guard.rules[0].history[0] == pytest.approx(3.0, rel=1e-12)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--update-freq")
def test_a_run_judges_the_loss_over_every_batch_and_rank_weighted_by_sample_size(data_bin, tmp_path):
    """2 gloo ranks, --update-freq 2, rank 1's first batch of each update cut to 1 sentence (32 tokens,
    the others 8 x 32): each judged loss is the update's 4 summed losses over their 800 tokens, in bits."""
    cfg = run_cfg(data_bin, tmp_path, "--spike-rollback", "--distributed-world-size", "2", "--update-freq", "2",
                  "--max-update", "3")
    history = call_main(cfg, functools.partial(spike_mains.uneven, record_dir=str(tmp_path)))
    ranks = [json.load(open(tmp_path / f"{rank}.json")) for rank in (0, 1)]
    assert [[size for _, size in batches] for batches in ranks[1]] == [[32.0, 256.0]] * 3
    assert [[size for _, size in batches] for batches in ranks[0]] == [[256.0, 256.0]] * 3
    assert len(history) == 3
    for update, judged in enumerate(history):
        batches = ranks[0][update] + ranks[1][update]
        assert judged == pytest.approx(sum(loss for loss, _ in batches) / 800 / LN2, rel=1e-6)
        unweighted = sum(loss / size for loss, size in batches) / 4 / LN2  # the batches' own means, averaged
        assert abs(judged - unweighted) > 1e-3


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--spike-window", "--skip-batches")
def test_a_rollback_leaves_the_histories_of_a_run_without_the_skipped_batches(data_bin, tmp_path):
    """Window 8, snapshots every 4, the 10th update poisoned, 12 updates: rolled back to update 8, the
    loss history at the end is the --skip-batches replay's: updates 5-8 and the 4 trained after."""
    spike = ["--spike-rollback", "--spike-window", "8", "--spike-snapshot-interval", "4", "--spike-factor", "1.5",
             "--max-update", "12"]
    got = call_main(run_cfg(data_bin, tmp_path, *spike), functools.partial(spike_mains.poisoned, poison_call=10))
    assert got["rollbacks"] == [10] and got["skipped"] == [(1, 9, 10)] and got["updates"] == 12
    replay = call_main(run_cfg(data_bin, tmp_path, *spike, "--skip-batches", format_windows(got["skipped"])),
                       functools.partial(spike_mains.poisoned, poison_call=0))
    assert replay["rollbacks"] == [] and len(replay["histories"][0]) == 8
    assert got["histories"] == replay["histories"]
    assert max(got["histories"][0]) < 1.5 * min(got["histories"][0])  # the poisoned loss is not among them


@pytest.mark.flag_effect("--spike-snapshot-interval", "--spike-window")
def test_after_a_rollback_the_histories_are_the_snapshots():
    """Snapshots at updates 3 and 6; update 8 spikes: the state, the window skipped and the histories are
    update 6's (the values of updates 7 and 8 forgotten); what follows joins that history."""
    d = Driver("--spike-window", "3", "--spike-snapshot-interval", "3", "--spike-factor", "2", "--spike-gnorm-factor",
               "10")
    for i, loss in enumerate((1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0), start=1):
        assert d.update(loss, gnorm=10.0 * i) is False
    assert d.history() == [5.0, 6.0, 7.0] and d.history(1) == [50.0, 60.0, 70.0]
    assert d.update(100.0, gnorm=80.0) is True
    assert (d.trainer.num_updates, d.trainer.weight, d.guard.snapshot.update) == (6, 6.0, 6)
    assert d.guard.skipped == [(1, 7, 8)] and d.guard.rollbacks == [8]
    assert d.history() == [4.0, 5.0, 6.0] and d.history(1) == [40.0, 50.0, 60.0]  # update 6's
    assert d.update(5.5, gnorm=45.0) is False and d.history() == [5.0, 6.0, 5.5] and d.trainer.num_updates == 7
    state = d.guard.state_dict()  # a checkpoint keeps them as they are now
    assert state["histories"] == [[5.0, 6.0, 5.5], [50.0, 60.0, 45.0]] and state["rollbacks"] == [8]


def test_histories_saved_in_nats_load_in_base_2():
    """Checkpoints written before the loss was judged in base 2 held it in nats."""
    cfg = parse_train_args(["data-bin", "--spike-rollback", "--spike-gnorm-factor", "4"])
    guard = SpikeGuard(cfg.optimization)
    guard.load_state_dict({"histories": [[2 * LN2, 4 * LN2], [5.0]], "rollbacks": [3], "skipped": [[1, 2, 3]]})
    assert list(guard.rules[0].history) == pytest.approx([2.0, 4.0]) and list(guard.rules[1].history) == [5.0]
    guard.load_state_dict(guard.state_dict())
    assert list(guard.rules[0].history) == pytest.approx([2.0, 4.0]) and guard.skipped == [(1, 2, 3)]


def _spike_after_gap(gap: int):
    """--spike-window 2 (a horizon of 20 updates), --spike-max-rollbacks 1, a snapshot every update:
    a spike at update 5, then one at update 5 + ``gap``."""
    d = Driver("--spike-window", "2", "--spike-snapshot-interval", "1", "--spike-max-rollbacks", "1")
    for _ in range(4):
        assert d.update(1.0) is False
    assert d.update(50.0) is True and d.guard.rollbacks == [5] and d.trainer.num_updates == 4
    for _ in range(gap):
        assert d.update(1.0) is False
    assert d.trainer.num_updates == 4 + gap
    return d, d.update(50.0)


@pytest.mark.flag_effect("--spike-max-rollbacks", "--spike-window")
def test_two_spikes_inside_the_horizon_stop_the_run():
    with pytest.raises(TrainingDivergedError, match=r"^2 spikes within 20 updates \(the last at update 24: the loss "
                       r"50 is above 3 x 1.*--spike-max-rollbacks 1\."):
        _spike_after_gap(19)


@pytest.mark.flag_effect("--spike-max-rollbacks", "--spike-window")
def test_a_spike_outside_the_horizon_is_counted_alone():
    d, rolled_back = _spike_after_gap(20)  # update 5 is not above 25 - 20
    assert rolled_back is True and d.guard.rollbacks == [25] and d.guard.skipped == [(1, 5, 5), (1, 26, 26)]
    assert d.guard.metrics() == {"rollbacks": 2.0}  # every rollback of the run, in the records


@pytest.mark.flag_effect("--spike-gnorm-factor", "--spike-lr-scale")
def test_the_gradient_norm_rule_and_the_lr_scale_after_two_rollbacks():
    d = Driver("--spike-window", "2", "--spike-snapshot-interval", "1", "--spike-gnorm-factor", "3",
               "--spike-lr-scale", "0.5")
    assert [r.flag for r in d.guard.rules] == ["--spike-factor", "--spike-gnorm-factor"]
    assert d.update(1.0, gnorm=1.0) is False and d.update(1.0, gnorm=2.0) is False  # gnorm median 1.5
    assert d.update(1.0, gnorm=4.5) is False  # 3 x 1.5: not above
    assert d.update(1.0, gnorm=math.inf, stepped=False) is False  # an fp16 overflow's norm is no spike...
    assert d.history(1) == [2.0, 4.5]  # ...and does not join
    lr = d.trainer.optimizer.param_groups[0]["lr"]
    assert d.update(1.0, gnorm=9.76) is True  # above 3 x 3.25, the loss unremarkable
    assert d.trainer.num_updates == 3 and d.guard.rollbacks == [4]
    assert d.trainer.lr_scheduler.lr_scale == 0.5 and d.trainer.optimizer.param_groups[0]["lr"] == lr * 0.5
    assert d.update(math.nan, stepped=False) is True  # a skipped NaN update: counted as the next update
    assert d.guard.rollbacks == [4, 4] and d.trainer.num_updates == 3
    assert d.trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr * 0.25, rel=1e-12)


def test_without_the_gnorm_flag_only_the_loss_is_judged():
    d = Driver("--spike-window", "2")
    assert len(d.guard.rules) == 1
    assert [d.update(1.0, gnorm=g) for g in (1.0, 1.0, 1e6)] == [False] * 3


@pytest.mark.flag_effect("--spike-snapshot-interval")
def test_the_snapshot_interval_sets_where_a_rollback_lands():
    for interval, lands in ((3, 6), (4, 4), (20, 0)):  # 20: the default; only the epoch's start snapshot
        d = Driver("--spike-window", "2", "--spike-snapshot-interval", str(interval))
        for _ in range(7):
            assert d.update(1.0) is False
        assert d.update(9.0) is True
        assert (d.trainer.num_updates, d.trainer.weight, d.guard.skipped) == (lands, lands, [(1, lands + 1, 8)])
        # the momentum of ``lands`` steps; none at update 0 (the state is dropped, as before the first step)
        expected = None if lands == 0 else pytest.approx((1 - 0.9 ** lands) / 0.1, rel=1e-6)
        assert d.trainer.momentum() == expected


def test_a_rollback_restores_only_after_a_background_write_of_the_live_tensors_landed():
    """--async-save writes CPU parameters and optimizer state (all of them under --cpu and --cpu-offload)
    from the live tensors while a StepGate holds the optimizer steps; a rollback outside a step (a NaN
    update, skipped) must wait for the write too, whichever rule fired and wherever in the epoch."""
    d = Driver("--spike-window", "2", "--spike-snapshot-interval", "2")
    for _ in range(3):
        assert d.update(1.0) is False
    gate = StepGate()
    gate.hold()  # as ShardedDirectory.save does while DCP writes the live tensors in the background
    try:
        rolled_back = []
        thread = threading.Thread(target=lambda: rolled_back.append(d.update(math.nan, stepped=False)))
        thread.start()
        deadline = time.monotonic() + 30
        while gate.waited == 0 and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.waited == 1 and thread.is_alive()  # the rollback is waiting for the write
        assert d.trainer.weight == 3.0 and d.trainer.num_updates == 3  # nothing restored yet
        gate.release()
        thread.join(timeout=30)
    finally:
        gate.release()
        gate.detach()
    assert rolled_back == [True] and (d.trainer.weight, d.trainer.num_updates) == (2.0, 2)
