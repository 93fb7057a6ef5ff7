"""What goes on a panel's axes: each metric's unit, where the ticks go, and how their labels read."""
import math
import re
from typing import List, Optional

# The unit of each stat the trainer logs (trainer/metrics/, tasks/criterions.py). Losses are in base 2 per
# token, as fairseq logs them; memory figures are bytes / 1024**3 although their names say gb.
UNITS = {
    "loss": "bits/token", "nll_loss": "bits/token", "best_loss": "bits/token",
    "wps": "words/s", "wps_per_device": "words/s", "ups": "updates/s", "tflops": "TFLOP/s",
    "wpb": "words", "bsz": "sentences", "train_wall": "s", "wall": "s", "clip": "%", "mfu": "%",
    "gb_rss": "GiB", "gb_free": "GiB", "gb_peak_alloc": "GiB", "gb_reserved": "GiB", "gb_peak_reserved": "GiB",
    "param_gb": "GiB", "grad_gb": "GiB", "optim_gb": "GiB",
}
# Stats whose validation values measure something else than training's (no backward, other batches):
# drawn on a panel of their own, since on one axis the smaller curve is squashed flat.
OWN_VALIDATION_PANEL = {"wps", "wps_per_device", "ups", "wpb", "bsz", "tflops", "mfu"}
# ppl falls by orders of magnitude in the first updates: on a linear axis the rest of the curve is flat.
LOG_SCALE = {"ppl"}


def unit(metric: str) -> Optional[str]:
    """The unit of ``metric``, None for a plain number (ppl, lr, gnorm, loss_scale) or a stat not in UNITS."""
    return UNITS.get(metric)


def nice_ticks(low: float, high: float, at_least: int = 4) -> List[float]:
    """Round values (1, 2 or 5 times a power of ten apart) inside [low, high]: the widest such spacing
    that still gives ``at_least`` of them."""
    exponent = math.floor(math.log10(high - low))
    while True:
        for multiple in (5, 2, 1):
            step = multiple * 10.0 ** exponent
            first, last = math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9)
            if last - first + 1 >= at_least:
                return [float(f"{k * step:.12g}") for k in range(first, last + 1)]
        exponent -= 1


def log_ticks(low: float, high: float) -> List[float]:
    """log10 of round values inside [10**low, 10**high] (low and high are log10 too): the powers of ten
    and 2 and 5 times them; only the powers when that is more than 6; every multiple 1..9 of a power when
    that is fewer than 3 (a curve inside one decade); linear round values when even that is fewer."""
    def multiples_of_powers(multiples):
        decades = range(math.floor(low), math.ceil(high) + 1)
        return [d + math.log10(m) for d in decades for m in multiples if low <= d + math.log10(m) <= high]

    ticks = multiples_of_powers((1, 2, 5))
    if len(ticks) > 6:
        return multiples_of_powers((1,))
    if len(ticks) < 3:
        ticks = multiples_of_powers(range(1, 10))
    if len(ticks) < 3:
        ticks = [math.log10(v) for v in nice_ticks(10 ** low, 10 ** high, 3) if v > 0]
    return ticks


def labels(ticks: List[float]) -> List[str]:
    """One label per tick, all distinct: as many decimals as the spacing needs; powers of ten for
    values below 0.001 (learning rates) or from a million up."""
    if len(ticks) < 2:
        return [_plain(t) for t in ticks]
    step = min(abs(b - a) for a, b in zip(ticks, ticks[1:]))
    biggest = max(abs(t) for t in ticks)
    if biggest < 1e-3 or biggest >= 1e6:
        return [_scientific(t, step) for t in ticks]
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return [_plain(t) if t == 0 else f"{t:,.{decimals}f}" for t in ticks]


def log_labels(ticks: List[float]) -> List[str]:
    """Labels of a log axis's ticks (log10 values): the values they stand for."""
    values = [10 ** t for t in ticks]
    if all(abs(v - float(f"{v:.3g}")) <= 1e-9 * v for v in values):  # round values: no spacing needed
        return [_plain(v) for v in values]
    return labels(values)


def _plain(value: float) -> str:
    value = float(f"{value:.12g}")
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) < 1e-3:
        return _scientific(value, abs(value))
    return f"{value:.3g}"


def _scientific(value: float, step: float) -> str:
    """``1.5e-4``: as many digits as ``step`` needs at this value's power of ten."""
    if value == 0:
        return "0"
    digits = max(0, math.floor(math.log10(abs(value)) + 1e-9) - math.floor(math.log10(step) + 1e-9))
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m[1].replace("+", "") + m[2], f"{value:.{digits}e}")
