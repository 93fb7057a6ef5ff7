"""A run's scalar records, read back from what shard-train wrote: a ``--log-file`` (any ``--log-format``)
or a ``--tensorboard-logdir``.

Log lines have fairseq's shapes (see trainer/metrics/progress.py)::

    2026-11-23 23:07:15 | INFO | train_inner | epoch 001:     50 / 297 loss=10.4, ppl=1390.5, num_updates=50
    2026-11-23 23:07:30 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.133 | num_updates 100
    2026-11-23 23:07:15 | INFO | train_inner | {"epoch": 1, "loss": "10.4", "num_updates": "50"}
    2026-11-23 23:07:30 | INFO | valid | {"epoch": 1, "valid_loss": "8.133", "valid_num_updates": "100"}

The record's name column is its tag: ``train_inner`` holds the training curve, a validation subset's name
(``valid``, ``valid1``, ...) its validation curve; ``train`` (epoch summaries) and the loggers of modules
(dotted names) are not curves. The x of every point is ``num_updates``.
"""
import dataclasses
import json
import math
import os
import re
from typing import Dict, Iterable, List, Optional, Tuple

from shardtrain.core.errors import ConfigError

TRAIN = "train_inner"
_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| [A-Z]+ \| (?P<tag>[\w-]+) \| (?P<body>.*)$")
_NOT_CURVES = {"train"}  # epoch summaries repeat the train_inner curve's last stretch
_EVENTS = "events.out.tfevents"
# Why a log file can lack the training curve, and what to do: said where one is missing.
NO_INTERVAL_RECORDS = ("Logs written under --log-format tqdm (the default on a terminal) by earlier shardtrain "
                       "versions hold no interval records, and a run shorter than its --log-interval writes none. "
                       "Pass the run's --tensorboard-logdir instead, or train with --log-format simple (or json) "
                       "and a --log-interval below the number of updates.")


@dataclasses.dataclass
class Run:
    """One run's curves: ``series[(tag, metric)]`` = [(num_updates, value)], sorted by num_updates;
    ``nonfinite[metric]``: how many of its values were nan or inf (not drawable, so not in series);
    ``summaries``: how many epoch summaries (``train`` records) a log file held."""
    name: str
    series: Dict[Tuple[str, str], List[Tuple[float, float]]]
    nonfinite: Dict[str, int] = dataclasses.field(default_factory=dict)
    summaries: int = 0

    def metrics(self) -> List[str]:
        return sorted({metric for _, metric in self.series})


def read_run(path: str, name: Optional[str] = None) -> Run:
    """A log file, or a tensorboard logdir (any directory holding event files)."""
    if not os.path.exists(path):
        raise ConfigError(f"{path} does not exist. Pass a log file written with shard-train --log-file, or a "
                          "directory given to --tensorboard-logdir.")
    name = name or os.path.basename(os.path.normpath(path))
    summaries = 0
    if os.path.isdir(path):
        points = _tensorboard_points(path)
        what = "tensorboard events"
    else:
        records = list(_log_records(path))
        summaries = sum(tag in _NOT_CURVES for tag, _ in records)
        points = (p for tag, stats in records if tag not in _NOT_CURVES for p in _points(tag, stats))
        what = "training records"
    series, nonfinite = _series(points)
    if not series and nonfinite:
        raise ConfigError(f"{path}: every value it records ({', '.join(sorted(nonfinite))}) is nan or inf, so there "
                          "is nothing to draw (a run that diverged logs nan). Pass a run with finite records.")
    if not series and summaries:
        raise ConfigError(f"{path} holds {summaries} epoch summaries but no interval records (train_inner) and no "
                          f"validation records, so there is no curve to draw. {NO_INTERVAL_RECORDS}")
    if not series:
        raise ConfigError(f"{path} holds no {what} with num_updates: shard-plot draws what shard-train writes "
                          "with --log-file (any --log-format but none) or --tensorboard-logdir. Pass such a file "
                          "or directory.")
    return Run(name, series, nonfinite, summaries)


def _series(points: Iterable[Tuple[str, str, float, float]]):
    """Points grouped per (tag, metric); a resumed run that repeats an update keeps the later value.
    Also the count of nan/inf values per metric, which are left out (a diverged run logs loss nan)."""
    grouped: Dict[Tuple[str, str], Dict[float, float]] = {}
    for tag, metric, x, y in points:
        grouped.setdefault((tag, metric), {})[x] = y
    nonfinite: Dict[str, int] = {}
    series = {}
    for key, values in grouped.items():
        finite = sorted((x, y) for x, y in values.items() if math.isfinite(y))
        if len(finite) < len(values):
            nonfinite[key[1]] = nonfinite.get(key[1], 0) + len(values) - len(finite)
        if finite:
            series[key] = finite
    return series, nonfinite


def _log_records(path: str):
    """(tag, stats) of each record of a log file; the lines of modules' loggers (dotted names) are not."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                match = _LINE.match(line.rstrip("\n"))
                if match and "." not in match["tag"]:
                    yield match["tag"], parse_record(match["tag"], match["body"])
    except OSError as e:
        raise ConfigError(f"Cannot read {path}: {e.strerror or e}. Pass a readable log file.") from None


def parse_record(tag: str, body: str) -> Dict[str, float]:
    """The numeric stats of one record's text (any of the three shapes)."""
    if body.startswith("{"):
        try:
            raw = json.loads(body)
        except ValueError:
            return {}
        prefix = f"{tag}_"
        raw = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in raw.items()}
    elif "=" in body:  # simple's interval line: "epoch 001:    50 / 297 k=v, k=v"
        raw = dict(pair.split("=", 1) for pair in body.split(" ", 1)[-1].split(", ") if "=" in pair)
        raw = {k.split()[-1]: v for k, v in raw.items()}  # the first key follows the position
    else:  # a summary: "epoch 001 | valid on 'valid' subset | loss 8.1 | num_updates 100"
        raw = dict(field.rsplit(" ", 1) for field in body.split(" | ") if " " in field)
    return {k: v for k, v in ((k, _number(v)) for k, v in raw.items()) if v is not None}


def _points(tag: str, stats: Dict[str, float]):
    x = stats.get("num_updates")
    if x is not None and math.isfinite(x):
        for metric, y in stats.items():
            if metric != "num_updates":
                yield tag, metric, x, y


def _number(value) -> Optional[float]:
    try:
        return float(value)  # nan and inf too: _series counts them
    except (TypeError, ValueError):
        return None


def _tensorboard_points(logdir: str):
    """TensorboardWriter writes each tag under ``<logdir>/<tag>/``; the step is num_updates."""
    # Imported here: tensorboard's reader is slow to import and only needed for event files.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for directory, _, files in sorted(os.walk(logdir)):
        if not any(_EVENTS in f for f in files):
            continue
        tag = os.path.relpath(directory, logdir)
        if tag in _NOT_CURVES or tag == os.curdir:
            continue
        events = EventAccumulator(directory, size_guidance={"scalars": 0})  # 0: keep every point
        events.Reload()
        for metric in events.Tags()["scalars"]:
            for event in events.Scalars(metric):
                yield tag, metric, float(event.step), float(event.value)
