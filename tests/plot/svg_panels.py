"""Reads back what shard-plot drew, from the SVG text alone: panels, their labels, curves and markers."""
import dataclasses
import re
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional, Tuple

SVG = "{http://www.w3.org/2000/svg}"


@dataclasses.dataclass
class DrawnPanel:
    title: str
    metric: str
    part: str
    area: Tuple[float, float, float, float]  # left, top, width, height
    unit: Optional[str]
    yticks: List[str]
    xticks: List[str]
    curves: List[dict]  # run, tag, stroke, width, dash, points
    markers: List[dict]  # run, shape, stroke, (x, y)


def read_panels(svg_text: str) -> Dict[str, DrawnPanel]:
    root = ET.fromstring(svg_text)  # well-formed XML
    panels = {}
    for g in root.iter(SVG + "g"):
        if g.get("data-panel") is None:
            continue
        texts = {kind: [t.text for t in g.iter(SVG + "text") if t.get("class") == kind]
                 for kind in ("unit", "ytick", "xtick")}
        rect = next(r for r in g.iter(SVG + "rect") if r.get("class") == "plot-area")
        panels[g.get("data-panel")] = DrawnPanel(
            g.get("data-panel"), g.get("data-metric"), g.get("data-part"),
            tuple(float(rect.get(k)) for k in ("x", "y", "width", "height")),
            (texts["unit"] or [None])[0], texts["ytick"], texts["xtick"],
            [dict(run=p.get("data-run"), tag=p.get("data-tag"), metric=p.get("data-metric"),
                  stroke=p.get("stroke"), width=float(p.get("stroke-width")), dash=p.get("stroke-dasharray"),
                  points=[tuple(map(float, xy.split(","))) for xy in p.get("points").split()])
             for p in g.iter(SVG + "polyline")],
            [dict(run=p.get("data-run"), shape=p.get("data-marker"), stroke=p.get("stroke"), d=p.get("d"),
                  at=tuple(map(float, re.fullmatch(r"translate\(([-\d.]+),([-\d.]+)\)", p.get("transform")).groups())))
             for p in g.iter(SVG + "path") if p.get("class") == "marker"])
    return panels
