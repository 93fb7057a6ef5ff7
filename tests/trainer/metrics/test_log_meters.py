"""MetricsLogger: averages, sums, speeds, derived values, timers, state."""
import io
import math

import pytest
import torch

from shardtrain.trainer.metrics.meters import MetricsLogger, perplexity
from shardtrain.trainer.metrics.process_memory import resident_memory_gb


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


@pytest.fixture
def clock():
    return FakeClock()


def test_weighted_average_and_rounding(clock):
    m = MetricsLogger(clock)
    m.log_scalar("loss", 2.0, weight=3)
    m.log_scalar("loss", 4.0, weight=1)
    m.log_scalar("third", 1 / 3)
    m.log_scalar("bsz", 7.123456, round=1)
    assert m.smoothed_values() == {"loss": 2.5, "third": 0.333, "bsz": 7.1}


def test_zero_weight_value_does_not_poison_average(clock):
    m = MetricsLogger(clock)
    m.log_scalar("loss", 3.0, weight=2)
    m.log_scalar("loss", math.inf, weight=0)
    assert m.smoothed_values()["loss"] == 3.0
    only_zero = MetricsLogger(clock)
    only_zero.log_scalar("x", 5.0, weight=0)  # no weight at all: the last value
    assert only_zero.smoothed_values() == {"x": 5.0}


def test_sum_keeps_ints(clock):
    m = MetricsLogger(clock)
    m.log_sum("ntokens", 3)
    m.log_sum("ntokens", 4)
    values = m.smoothed_values()
    assert values == {"ntokens": 7} and isinstance(values["ntokens"], int)


def test_speed_counts_from_first_log_and_from_reset(clock):
    m = MetricsLogger(clock)
    clock.t = 1.0
    m.log_speed("wps", 100)  # the meter starts here
    clock.t = 2.0
    m.log_speed("wps", 300)
    clock.t = 4.0
    assert m.smoothed_values() == {"wps": round(400 / 3, 3)}
    clock.t = 5.0
    m.reset()
    assert m.smoothed_values() == {}  # nothing logged in the new window
    clock.t = 6.0
    m.log_speed("wps", 50)
    clock.t = 7.0
    assert m.smoothed_values() == {"wps": 25.0}


def test_derived_perplexity_in_logged_order(clock):
    m = MetricsLogger(clock)
    m.log_scalar("loss", 3.0)
    m.log_derived("ppl", lambda v: perplexity(v["loss"]), round=2)
    m.log_sum("n", 1)
    assert list(m.smoothed_values().items()) == [("loss", 3.0), ("ppl", 8.0), ("n", 1)]
    m.reset()
    m.log_sum("n", 2)
    # loss has nothing since the reset, so ppl cannot be computed and is left out
    assert m.smoothed_values() == {"n": 2}
    assert perplexity(5000.0) == math.inf and perplexity(None) == 0.0


def test_timer_accumulates_and_survives_reset_while_running(clock):
    m = MetricsLogger(clock)
    m.stop_timer("train_wall")  # never started: ignored
    clock.t = 1.0
    m.start_timer("train_wall")
    clock.t = 3.5
    m.stop_timer("train_wall")
    clock.t = 10.0
    m.start_timer("train_wall")
    clock.t = 11.0
    assert m.smoothed_values() == {"train_wall": 2.5 + 1.0}  # running part included
    clock.t = 12.0
    m.stop_timer("train_wall")
    assert m.smoothed_values() == {"train_wall": 4.5}
    m.start_timer("train_wall")
    clock.t = 20.0
    m.reset()  # still running: counts on from the reset
    clock.t = 22.0
    m.stop_timer("train_wall")
    assert m.smoothed_values() == {"train_wall": 2.0}
    m.reset()
    assert m.smoothed_values() == {}


def _filled(clock):
    m = MetricsLogger(clock)
    clock.t = 1.0
    m.log_scalar("loss", torch.tensor(2.0), weight=torch.tensor(2.0))
    m.log_scalar("loss", 5.0)
    m.log_derived("ppl", lambda v: perplexity(v["loss"]), round=2)
    m.log_speed("wps", torch.tensor(300))
    m.log_sum("ntokens", 300)
    m.start_timer("train_wall")
    clock.t = 4.0
    m.stop_timer("train_wall")
    return m


def test_state_dict_round_trip_through_weights_only_load(clock):
    m = _filled(clock)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)  # plain Python values only
    buf.seek(0)
    state = torch.load(buf, weights_only=True)

    other_clock = FakeClock()
    other_clock.t = 100.0
    restored = MetricsLogger(other_clock)
    restored.load_state_dict(state)
    other_clock.t = 101.0  # 3 s were on the wps meter when saved; 1 more now
    expected = {"loss": 3.0, "wps": 300 / 4, "ntokens": 300, "train_wall": 3.0}
    assert restored.smoothed_values() == expected
    # the derived meter kept its place and comes back once its function is given
    restored.log_derived("ppl", lambda v: perplexity(v["loss"]), round=2)
    assert list(restored.smoothed_values()) == ["loss", "ppl", "wps", "ntokens", "train_wall"]
    assert restored.smoothed_values()["ppl"] == 8.0


def test_tensors_are_converted_only_when_read(clock, monkeypatch):
    w = torch.tensor(3.0, requires_grad=True)
    m = MetricsLogger(clock)
    calls = []
    real_item = torch.Tensor.item

    def counting_item(self):
        calls.append(1)
        return real_item(self)

    monkeypatch.setattr(torch.Tensor, "item", counting_item)
    for step in range(1, 5):
        loss = w * step  # part of an autograd graph
        m.log_scalar("loss", loss, weight=torch.tensor(1.0))
        m.log_speed("wps", torch.tensor(10))
        m.log_sum("ntokens", torch.tensor(10))
    assert calls == []  # nothing synced in the loop
    values = m.smoothed_values()
    assert calls  # converted at read time
    assert values["loss"] == pytest.approx(3.0 * 2.5) and isinstance(values["loss"], float)
    assert values["ntokens"] == 40 and isinstance(values["ntokens"], int)
    # the accumulated loss must not hold the graph alive
    assert not m._meters["loss"].total.requires_grad


def test_misuse_raises(clock):
    m = MetricsLogger(clock)
    m.log_scalar("loss", 1.0)
    with pytest.raises(TypeError, match="loss"):
        m.log_sum("loss", 1.0)
    with pytest.raises(ValueError, match="one-element"):
        m.log_scalar("vec", torch.ones(3))


def test_resident_memory_sees_a_touched_block():
    before = resident_memory_gb()
    block = torch.ones(64 * 1024 * 1024, dtype=torch.float32)  # 0.25 GiB, touched
    after = resident_memory_gb()
    assert 0 < before and after - before > 0.2
    del block
