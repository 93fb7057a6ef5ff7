"""Training metrics: one :class:`MetricsLogger` per tag, no global state.

fairseq keeps its aggregators in a module-level registry entered with context
managers; here the trainer owns one logger per tag ("train_inner", "train",
"valid") and passes it where it is needed.

Values may be Python numbers or one-element tensors. Tensors are detached and
accumulated on their own device and only turned into Python numbers by
:meth:`MetricsLogger.smoothed_values`, so logging a loss every step does not
force a GPU sync; reading the values (every ``--log-interval`` updates) does.
"""
import math
import time
from typing import Any, Callable, Dict, Mapping, Optional

import torch

MetricValue = Any  # a Python number or a one-element tensor (converted lazily)
DerivedFn = Callable[[Mapping[str, float]], Optional[float]]


class MetricsLogger:
    """Named meters for one tag, reported in the order they were first logged.

    ``clock`` returns seconds; tests inject a fake one to make speeds and
    timers deterministic.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._meters: Dict[str, "_Meter"] = {}

    def log_scalar(self, key: str, value: MetricValue, weight: MetricValue = 1.0, round: Optional[int] = 3) -> None:
        """Weighted average of ``value`` (e.g. loss weighted by sample size)."""
        self._meter(key, _Average, round).update(value, weight)

    def log_sum(self, key: str, value: MetricValue, round: Optional[int] = 3) -> None:
        """Running sum of ``value`` (e.g. number of tokens seen)."""
        self._meter(key, _Sum, round).update(value)

    def log_speed(self, key: str, value: MetricValue, round: Optional[int] = 3,
                  since: Optional[float] = None) -> None:
        """Sum of ``value`` per second since the meter started or was reset
        (wps from ntokens, ups from 1 per update). ``since``: the clock time a
        new meter starts from (when the work behind the first value began);
        without it a meter made by its first value would time nothing of it."""
        self._meter(key, _Speed, round, since).update(value)

    def log_derived(self, key: str, fn: DerivedFn, round: Optional[int] = 3) -> None:
        """A value computed at read time from the other meters' unrounded values,
        e.g. ``log_derived("ppl", lambda v: perplexity(v["loss"]), round=2)``.

        Calling it again (every step, fairseq style) only replaces ``fn``. If
        ``fn`` raises KeyError or returns None, the key is left out.
        """
        self._meter(key, _Derived, round).fn = fn

    def start_timer(self, key: str, round: Optional[int] = 3) -> None:
        """Start (or restart) accumulating seconds under ``key`` (e.g. train_wall)."""
        self._meter(key, _Timer, round).start(self._clock())

    def stop_timer(self, key: str) -> None:
        """Add the seconds since :meth:`start_timer`. A timer that is not
        running is left alone, so a ``finally:`` may always call this."""
        meter = self._meters.get(key)
        if meter is not None:
            _check_kind(key, meter, _Timer)
            meter.stop(self._clock())

    def smoothed_values(self) -> Dict[str, Any]:
        """The current values in first-logged order, floats rounded.

        Meters with nothing logged since the last :meth:`reset` are left out.
        This is where tensors are converted (one sync per tensor meter).
        """
        now = self._clock()
        raw = {k: m.value(now) for k, m in self._meters.items() if not isinstance(m, _Derived)}
        raw = {k: v for k, v in raw.items() if v is not None}
        out = {}
        for key, meter in self._meters.items():
            value = _derive(meter, raw) if isinstance(meter, _Derived) else raw.get(key)
            if value is not None:
                out[key] = _round(value, meter.round)
        return out

    def reset(self) -> None:
        """Start a new window: clear every meter, keep the order and running timers."""
        now = self._clock()
        for meter in self._meters.values():
            meter.reset(now)

    def state_dict(self) -> Dict[str, Any]:
        """Plain Python values only (tensors are converted), so checkpoints load
        with ``weights_only=True``. Derived meters keep their place but not
        their function; the next :meth:`log_derived` call supplies it again."""
        now = self._clock()
        return {
            "meters": [
                {"key": k, "kind": type(m).__name__, "round": m.round, "state": m.state_dict(now)}
                for k, m in self._meters.items()
            ]
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        now = self._clock()
        self._meters = {}
        for entry in state["meters"]:
            meter = _KINDS[entry["kind"]](entry["round"], now)
            meter.load_state_dict(entry["state"], now)
            self._meters[entry["key"]] = meter

    def _meter(self, key: str, kind: type, round: Optional[int], since: Optional[float] = None) -> "_Meter":
        meter = self._meters.get(key)
        if meter is None:
            meter = self._meters[key] = kind(round, self._clock() if since is None else since)
        _check_kind(key, meter, kind)
        return meter


def perplexity(loss: Optional[float], base: float = 2.0) -> float:
    """``base ** loss`` as fairseq reports it (losses are in base 2), inf on overflow."""
    if loss is None:
        return 0.0
    try:
        return base**loss
    except OverflowError:
        return math.inf


# --- meters -----------------------------------------------------------------


class _Meter:
    def __init__(self, round: Optional[int], now: float):
        self.round = round
        self.reset(now)

    def reset(self, now: float) -> None:
        raise NotImplementedError

    def value(self, now: float) -> Optional[float]:
        """The unrounded value, or None when nothing was logged since reset."""
        raise NotImplementedError

    def state_dict(self, now: float) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any], now: float) -> None:
        pass


class _Average(_Meter):
    def reset(self, now):
        self.total, self.weight, self.last = 0.0, 0.0, None

    def update(self, value, weight):
        value = _detach(value)
        self.last = value
        # Skipping zero weights keeps an inf/nan value (fp16 overflow) out of the sum.
        if isinstance(weight, (int, float)) and weight == 0:
            return
        self.total = self.total + value * _detach(weight)
        self.weight = self.weight + _detach(weight)

    def value(self, now):
        weight = _to_number(self.weight)
        if weight == 0:
            return _to_number(self.last)
        return _to_number(self.total) / weight

    def state_dict(self, now):
        return {"total": _to_number(self.total), "weight": _to_number(self.weight), "last": _to_number(self.last)}

    def load_state_dict(self, state, now):
        self.total, self.weight, self.last = state["total"], state["weight"], state["last"]


class _Sum(_Meter):
    def reset(self, now):
        self.total, self.count = 0, 0

    def update(self, value):
        self.total = self.total + _detach(value)
        self.count += 1

    def value(self, now):
        return _to_number(self.total) if self.count else None

    def state_dict(self, now):
        return {"total": _to_number(self.total), "count": self.count}

    def load_state_dict(self, state, now):
        self.total, self.count = state["total"], state["count"]


class _Speed(_Meter):
    def reset(self, now):
        self.total, self.count, self.elapsed_before, self.started = 0, 0, 0.0, now

    def update(self, value):
        self.total = self.total + _detach(value)
        self.count += 1

    def elapsed(self, now):
        return self.elapsed_before + (now - self.started)

    def value(self, now):
        if not self.count:
            return None
        elapsed = self.elapsed(now)
        return _to_number(self.total) / elapsed if elapsed > 0 else 0.0

    def state_dict(self, now):
        return {"total": _to_number(self.total), "count": self.count, "elapsed": self.elapsed(now)}

    def load_state_dict(self, state, now):
        # Time between saving and resuming does not count, as in fairseq.
        self.total, self.count = state["total"], state["count"]
        self.elapsed_before, self.started = state["elapsed"], now


class _Timer(_Meter):
    def __init__(self, round, now):
        self.started: Optional[float] = None
        super().__init__(round, now)

    def reset(self, now):
        self.seconds = 0.0
        # A timer running across a reset keeps running, counting from now.
        if self.started is not None:
            self.started = now
        self.used = self.started is not None

    def start(self, now):
        self.started, self.used = now, True

    def stop(self, now):
        if self.started is not None:
            self.seconds += now - self.started
            self.started = None

    def value(self, now):
        if not self.used:
            return None
        running = now - self.started if self.started is not None else 0.0
        return self.seconds + running

    def state_dict(self, now):
        return {"seconds": self.value(now) or 0.0, "used": self.used}

    def load_state_dict(self, state, now):
        self.seconds, self.used, self.started = state["seconds"], state["used"], None


class _Derived(_Meter):
    def __init__(self, round, now):
        self.fn: Optional[DerivedFn] = None
        super().__init__(round, now)

    def reset(self, now):
        pass  # nothing accumulated; the function is kept

    def value(self, now):
        raise AssertionError("derived meters are computed by MetricsLogger")


_KINDS = {cls.__name__: cls for cls in (_Average, _Sum, _Speed, _Timer, _Derived)}


def _derive(meter: _Derived, values: Mapping[str, float]) -> Optional[float]:
    if meter.fn is None:  # restored from a state_dict, not logged again yet
        return None
    try:
        return meter.fn(values)
    except KeyError:  # an input meter has nothing logged since the last reset
        return None


def _check_kind(key: str, meter: _Meter, kind: type) -> None:
    if not isinstance(meter, kind):
        raise TypeError(f"metric {key!r} is a {type(meter).__name__[1:]} meter, not a {kind.__name__[1:]} meter")


def _detach(value: MetricValue) -> MetricValue:
    if torch.is_tensor(value):
        if value.numel() != 1:
            raise ValueError(f"metrics take one-element tensors, got shape {tuple(value.shape)}")
        # Detach so an accumulated loss does not keep its autograd graph alive.
        return value.detach()
    return value


def _to_number(value: Any) -> Any:
    """Tensors and numpy scalars to Python numbers (this syncs a GPU tensor)."""
    item = getattr(value, "item", None)
    return item() if item is not None else value


def _round(value: Any, ndigits: Optional[int]) -> Any:
    if ndigits is None or not isinstance(value, float) or not math.isfinite(value):
        return value
    return round(value, ndigits)
