"""Curves as an SVG file: a grid of small panels, one per metric, one colour and marker per run, training
solid and validation dashed.

Written by hand: none of shardtrain's dependencies draws (tensorboard shows curves in a browser but cannot
save a picture, and matplotlib would be a dependency for one picture). SVG is text: every browser opens it,
GitHub shows it in a README, and a test can read it back: each panel is a ``<g data-panel>`` holding its
``plot-area`` rect, its ``title``, ``unit``, ``ytick`` and ``xtick`` texts, one ``<polyline>`` per curve
(``data-run``, ``data-tag``, ``data-metric``), the curves' ``marker`` paths, and for each mark (an update
where something happened: a stop and resume) a dashed ``mark`` line (``data-update``) and its ``mark-label``.

Runs that coincide (a rerun, the same log passed twice) stay visible: each run has its own colour and
marker shape, marks other points of its curves than the runs before it, and is drawn thinner than them,
so a curve on top of another leaves the one below showing at its edges.
"""
import dataclasses
import math
from typing import List, Sequence, Tuple
from xml.sax.saxutils import escape, quoteattr

from shardtrain.plot import axes
from shardtrain.plot.records import TRAIN, Run

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
# name -> path around (0, 0); the unfilled ones (plus, cross) are strokes only
MARKERS = {
    "circle": "M-3.2,0A3.2,3.2 0 1,0 3.2,0A3.2,3.2 0 1,0 -3.2,0Z", "square": "M-2.8,-2.8H2.8V2.8H-2.8Z",
    "triangle": "M0,-3.7L3.3,2.4H-3.3Z", "diamond": "M0,-3.8L3.2,0L0,3.8L-3.2,0Z",
    "triangle-down": "M0,3.7L3.3,-2.4H-3.3Z", "plus": "M-3.8,0H3.8M0,-3.8V3.8",
    "cross": "M-3,-3L3,3M-3,3L3,-3", "bar": "M-3.8,-1.5H3.8V1.5H-3.8Z",
}
MARKS_PER_CURVE = 6
PANEL_W, PANEL_H = 300, 200
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 70, 14, 26, 34  # inside a panel: unit, tick labels, title, x axis
LEGEND_H = 28
CHAR_W = 6.5  # px per character at font-size 11: for x labels that must not overlap
LINE_H = 13  # px between two y labels


@dataclasses.dataclass(frozen=True)
class Panel:
    """One metric's panel: all its curves, or (``part``) only the training or only the validation ones."""
    metric: str
    part: str = "all"  # "train" or "valid": the metric's training and validation curves are apart

    def holds(self, tag: str) -> bool:
        return self.part == "all" or (tag == TRAIN) == (self.part == "train")

    def title(self, log: bool) -> str:
        part = {"train": " (training)", "valid": " (validation)"}.get(self.part, "")
        return self.metric + part + (" (log scale)" if log else "")


def plan_panels(runs: Sequence[Run], metrics: Sequence[str]) -> List[Panel]:
    """A panel per metric; two for a throughput whose validation values are not on training's scale."""
    panels = []
    for metric in metrics:
        tags = {tag for run in runs for tag, m in run.series if m == metric}
        if metric in axes.OWN_VALIDATION_PANEL and TRAIN in tags and len(tags) > 1:
            panels += [Panel(metric, "train"), Panel(metric, "valid")]
        else:
            panels.append(Panel(metric))
    return panels


def render(runs: Sequence[Run], metrics: Sequence[str], marks: Sequence[Tuple[float, str]] = ()) -> str:
    """``marks``: (update, label) pairs, a vertical line in every panel whose updates reach it."""
    panels = plan_panels(runs, metrics)
    columns = 3 if len(panels) <= 6 or len(panels) == 9 else 4  # rows as full as can be
    columns = min(columns, len(panels))
    width, height = PANEL_W * columns, LEGEND_H + PANEL_H * math.ceil(len(panels) / columns)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>', *_legend(runs)]
    for i, panel in enumerate(panels):
        parts += _panel(runs, panel, PANEL_W * (i % columns), LEGEND_H + PANEL_H * (i // columns), marks)
    return "\n".join(parts + ["</svg>"]) + "\n"


def _legend(runs: Sequence[Run]) -> List[str]:
    out, x = [], 10
    for i, run in enumerate(runs):
        out.append(f'<line x1="{x}" y1="14" x2="{x + 22}" y2="14" stroke="{_colour(i)}" '
                   f'stroke-width="{_width(i, len(runs))}"/>')
        out.append(_marker("legend-marker", run.name, i, x + 11, 14))
        out.append(f'<text x="{x + 27}" y="18">{escape(run.name)}</text>')
        x += 40 + 7 * len(run.name)
    out.append(f'<text x="{x + 10}" y="18" fill="#555">solid: training, dashed: validation</text>')
    return out


@dataclasses.dataclass
class _Frame:
    """A panel's plotting area and the values at its edges; maps a point to pixels."""
    left: float
    top: float
    w: float
    h: float
    x_span: Tuple[float, float]
    y_span: Tuple[float, float]  # log10 values on a log axis
    log: bool

    def px(self, x: float) -> float:
        return self.left + (x - self.x_span[0]) / (self.x_span[1] - self.x_span[0]) * self.w

    def py(self, scaled_y: float) -> float:
        return self.top + self.h - (scaled_y - self.y_span[0]) / (self.y_span[1] - self.y_span[0]) * self.h

    def at(self, x: float, y: float) -> Tuple[float, float]:
        return self.px(x), self.py(_scale(y, self.log))


def _panel(runs: Sequence[Run], panel: Panel, x0: float, y0: float, marks=()) -> List[str]:
    curves = [(i, run, tag, points) for i, run in enumerate(runs)
              for (tag, m), points in sorted(run.series.items()) if m == panel.metric and panel.holds(tag)]
    log = panel.metric in axes.LOG_SCALE and all(y > 0 for *_, points in curves for _, y in points)
    frame = _Frame(x0 + MARGIN_L, y0 + MARGIN_T, PANEL_W - MARGIN_L - MARGIN_R, PANEL_H - MARGIN_T - MARGIN_B,
                   _span([x for *_, points in curves for x, _ in points]),
                   _span([_scale(y, log) for *_, points in curves for _, y in points]), log)
    title = panel.title(log)
    out = [f'<g data-panel={quoteattr(title)} data-metric={quoteattr(panel.metric)} data-part="{panel.part}">',
           f'<text class="title" x="{frame.left + frame.w / 2}" y="{y0 + 16}" text-anchor="middle" '
           f'font-weight="bold">{escape(title)}</text>',
           f'<rect class="plot-area" x="{frame.left}" y="{frame.top}" width="{frame.w}" height="{frame.h}" '
           'fill="none" stroke="#999"/>']
    out += _y_axis(frame, axes.unit(panel.metric), x0) + _x_axis(frame) + _marks(frame, marks)
    for i, run, tag, points in curves:
        out += _curve(frame, i, len(runs), run.name, tag, panel.metric, points)
    return out + ["</g>"]


def _y_axis(frame: _Frame, unit, x0: float) -> List[str]:
    low, high = frame.y_span
    ticks = axes.log_ticks(low, high) if frame.log else axes.nice_ticks(low, high)
    texts = axes.log_labels(ticks) if frame.log else axes.labels(ticks)
    out, last_label = [], math.inf
    for tick, text in zip(ticks, texts):
        y = frame.py(tick)
        out.append(f'<line x1="{frame.left - 3}" y1="{y:.1f}" x2="{frame.left + frame.w}" y2="{y:.1f}" '
                   'stroke="#eee"/>')
        if last_label - y >= LINE_H:  # a log axis crowds its top ticks: every one has a line, not a label
            out.append(f'<text class="ytick" x="{frame.left - 5}" y="{y + 4:.1f}" text-anchor="end">{text}</text>')
            last_label = y
    if unit:
        x, y = x0 + 12, frame.top + frame.h / 2
        out.append(f'<text class="unit" x="{x}" y="{y}" transform="rotate(-90 {x} {y})" text-anchor="middle" '
                   f'fill="#555">{escape(unit)}</text>')
    return out


def _x_axis(frame: _Frame) -> List[str]:
    low, high = frame.x_span
    for at_least in (4, 3, 2):  # as many labels as fit side by side
        ticks = axes.nice_ticks(low, high, at_least)
        texts = axes.labels(ticks)
        room = frame.px(ticks[1]) - frame.px(ticks[0]) if len(ticks) > 1 else frame.w
        if room >= CHAR_W * max(map(len, texts)) + 6:
            break
    out = [f'<text class="xtick" x="{frame.px(t):.1f}" y="{frame.top + frame.h + 14}" text-anchor="middle">'
           f'{text}</text>' for t, text in zip(ticks, texts)]
    out.append(f'<text class="xlabel" x="{frame.left + frame.w / 2}" y="{frame.top + frame.h + 28}" '
               'text-anchor="middle" fill="#555">updates</text>')
    return out


def _marks(frame: _Frame, marks) -> List[str]:
    """A grey dashed line at each mark's update, under the curves, labelled at its top; none outside the panel."""
    out = []
    for update, label in marks:
        if not frame.x_span[0] <= update <= frame.x_span[1]:
            continue
        x = frame.px(update)
        out.append(f'<line class="mark" data-update="{update:g}" x1="{x:.1f}" y1="{frame.top}" x2="{x:.1f}" '
                   f'y2="{frame.top + frame.h}" stroke="#777" stroke-dasharray="2,3"/>')
        out.append(f'<text class="mark-label" x="{x + 3:.1f}" y="{frame.top + 10}" font-size="9" fill="#555">'
                   f'{escape(label)}</text>')
    return out


def _curve(frame: _Frame, i: int, n_runs: int, name: str, tag: str, metric: str, points) -> List[str]:
    coords = " ".join("%.2f,%.2f" % frame.at(x, y) for x, y in points)
    dash = "" if tag == TRAIN else ' stroke-dasharray="5,3"'
    out = [f'<polyline data-run={quoteattr(name)} data-tag={quoteattr(tag)} data-metric={quoteattr(metric)} '
           f'points="{coords}" fill="none" stroke="{_colour(i)}" stroke-width="{_width(i, n_runs)}"{dash}/>']
    for k in marked_points(len(points), i, n_runs):
        out.append(_marker("marker", name, i, *frame.at(*points[k])))
    return out


def marked_points(count: int, slot: int, slots: int) -> List[int]:
    """Which of a curve's ``count`` points carry its run's marker: up to MARKS_PER_CURVE spread evenly,
    the run in ``slot`` of ``slots`` marking points between those of the others (with at least ``slots``
    points per mark, runs with the same points never mark the same one)."""
    marks = max(1, min(MARKS_PER_CURVE, count // slots))
    stride = count / marks
    return sorted({min(count - 1, int((j + (slot + 0.5) / slots) * stride)) for j in range(marks)})


def _marker(kind: str, run: str, i: int, x: float, y: float) -> str:
    shape = list(MARKERS)[i % len(MARKERS)]
    return (f'<path class="{kind}" data-run={quoteattr(run)} data-marker="{shape}" '
            f'transform="translate({x:.2f},{y:.2f})" d="{MARKERS[shape]}" fill="white" stroke="{_colour(i)}" '
            'stroke-width="1.3"/>')


def _width(i: int, n_runs: int) -> float:
    """Earlier runs are drawn wider: a later run that coincides with one leaves its edges showing."""
    return 1.5 + (1.5 * (n_runs - 1 - i) / (n_runs - 1) if n_runs > 1 else 0.0)


def _span(values: List[float]) -> Tuple[float, float]:
    low, high = min(values), max(values)
    if high == low:  # one point or a flat curve: give it a band to sit in
        pad = abs(low) * 0.1 or 1.0
        return low - pad, high + pad
    pad = (high - low) * 0.04
    return low - pad, high + pad


def _scale(y: float, log: bool) -> float:
    return math.log10(y) if log else y


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]
