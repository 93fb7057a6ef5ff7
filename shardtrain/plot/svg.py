"""Curves as an SVG file: a grid of small panels, one per metric, one colour per run, training solid and
validation dashed.

Written by hand: none of shardtrain's dependencies draws (tensorboard shows curves in a browser but cannot
save a picture, and matplotlib would be a dependency for one picture). SVG is text: every browser opens it,
GitHub shows it in a README, and a test can read the points back (each curve is one ``<polyline>`` with
``data-run``, ``data-tag`` and ``data-metric``).
"""
import math
from typing import List, Sequence, Tuple
from xml.sax.saxutils import escape, quoteattr

from shardtrain.plot.records import TRAIN, Run

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
PANEL_W, PANEL_H, COLUMNS = 300, 190, 3
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 58, 14, 26, 34  # inside a panel: room for ticks and the title
LEGEND_H = 28
# ppl falls by orders of magnitude in the first updates: on a linear axis the rest of the curve is flat.
LOG_SCALE = {"ppl"}


def render(runs: Sequence[Run], metrics: Sequence[str]) -> str:
    rows = math.ceil(len(metrics) / COLUMNS)
    width, height = PANEL_W * min(COLUMNS, len(metrics)), LEGEND_H + PANEL_H * rows
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>', *_legend(runs)]
    for i, metric in enumerate(metrics):
        x0, y0 = PANEL_W * (i % COLUMNS), LEGEND_H + PANEL_H * (i // COLUMNS)
        parts += _panel(runs, metric, x0, y0)
    return "\n".join(parts + ["</svg>"]) + "\n"


def _legend(runs: Sequence[Run]) -> List[str]:
    out, x = [], 10
    for i, run in enumerate(runs):
        out.append(f'<line x1="{x}" y1="14" x2="{x + 22}" y2="14" stroke="{_colour(i)}" stroke-width="2"/>')
        out.append(f'<text x="{x + 27}" y="18">{escape(run.name)}</text>')
        x += 40 + 7 * len(run.name)
    out.append(f'<text x="{x + 10}" y="18" fill="#555">solid: training, dashed: validation</text>')
    return out


def _panel(runs: Sequence[Run], metric: str, x0: float, y0: float) -> List[str]:
    curves = [(i, run, tag, points) for i, run in enumerate(runs)
              for (tag, m), points in sorted(run.series.items()) if m == metric]
    log = metric in LOG_SCALE and all(y > 0 for *_, points in curves for _, y in points)
    xs = [x for *_, points in curves for x, _ in points]
    ys = [_scale(y, log) for *_, points in curves for _, y in points]
    left, top = x0 + MARGIN_L, y0 + MARGIN_T
    w, h = PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B
    (xmin, xmax), (ymin, ymax) = _span(xs), _span(ys)

    def at(x, y):
        return left + (x - xmin) / (xmax - xmin) * w, top + h - (_scale(y, log) - ymin) / (ymax - ymin) * h

    title = metric + (" (log scale)" if log else "")
    out = [f'<text x="{left + w / 2}" y="{y0 + 16}" text-anchor="middle" font-weight="bold">{escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>']
    for tick in (log_ticks if log else nice_ticks)(ymin, ymax):
        y = top + h - (tick - ymin) / (ymax - ymin) * h
        out.append(f'<line x1="{left - 3}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end">{_label(tick, log)}</text>')
    for tick in nice_ticks(xmin, xmax):
        x = left + (tick - xmin) / (xmax - xmin) * w
        out.append(f'<text x="{x:.1f}" y="{top + h + 14}" text-anchor="middle">{_label(tick, False)}</text>')
    out.append(f'<text x="{left + w / 2}" y="{top + h + 28}" text-anchor="middle" fill="#555">updates</text>')
    for i, run, tag, points in curves:
        coords = " ".join("%.2f,%.2f" % at(x, y) for x, y in points)
        dash = "" if tag == TRAIN else ' stroke-dasharray="5,3"'
        out.append(f'<polyline data-run={quoteattr(run.name)} data-tag={quoteattr(tag)} '
                   f'data-metric={quoteattr(metric)} points="{coords}" fill="none" stroke="{_colour(i)}" '
                   f'stroke-width="1.5"{dash}/>')
    return out


def panel_box(index: int) -> Tuple[float, float, float, float]:
    """(left, top, width, height) of the plotting area of panel ``index``: for reading points back."""
    x0, y0 = PANEL_W * (index % COLUMNS), LEGEND_H + PANEL_H * (index // COLUMNS)
    return x0 + MARGIN_L, y0 + MARGIN_T, PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B


def nice_ticks(low: float, high: float, target: int = 4) -> List[float]:
    """Round values (1, 2 or 5 times a power of ten apart) inside [low, high]."""
    raw = (high - low) / target
    step = 10 ** math.floor(math.log10(raw))
    step *= min((1, 2, 5, 10), key=lambda m: abs(math.log(step * m / raw)))  # the round step nearest raw
    first = math.ceil(low / step - 1e-9) * step
    return [first + k * step for k in range(int((high - first) / step + 1e-9) + 1)]


def log_ticks(low: float, high: float) -> List[float]:
    """log10 of the round values (1, 2 and 5 times a power of ten; only the powers when that is too many)
    inside [low, high], themselves log10 values."""
    decades = range(math.floor(low), math.ceil(high) + 1)
    for multiples in ((1, 2, 5), (1,)):
        ticks = [d + math.log10(m) for d in decades for m in multiples if low <= d + math.log10(m) <= high]
        if len(ticks) <= 6:
            break
    return ticks


def _span(values: List[float]) -> Tuple[float, float]:
    low, high = min(values), max(values)
    if high == low:  # one point or a flat curve: give it a band to sit in
        pad = abs(low) * 0.1 or 1.0
        return low - pad, high + pad
    pad = (high - low) * 0.04
    return low - pad, high + pad


def _scale(y: float, log: bool) -> float:
    return math.log10(y) if log else y


def _label(value: float, log: bool) -> str:
    value = 10 ** value if log else value
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]
