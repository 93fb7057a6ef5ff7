"""``shard-plot RUN [RUN ...] --output curves.svg``: training and validation curves of one or more runs.

A RUN is a log file written with ``shard-train --log-file`` (any ``--log-format`` but ``none``) or a
``--tensorboard-logdir``. Each metric gets a panel (x: updates, y: the metric in its unit); each run a
colour and a marker; training is solid, validation dashed (validation throughput has a panel of its own).
By default the panels are loss, ppl, lr, gnorm, loss_scale, wps and memory (gb_rss, or gb_peak_alloc on
a GPU), those the runs have; ``--metrics`` picks any recorded stat. One line per RUN says what it holds.
"""
import argparse
import math
import sys
from typing import List, Tuple

from shardtrain.cli.errors import cli_entry
from shardtrain.config.flags import new_parser
from shardtrain.core.errors import ConfigError
from shardtrain.core.fileio import atomic_write_bytes
from shardtrain.plot import svg
from shardtrain.plot.records import NO_INTERVAL_RECORDS, TRAIN, Run, read_run

DEFAULT_METRICS = ("loss", "ppl", "lr", "gnorm", "loss_scale", "wps", "gb_peak_alloc", "gb_rss")


def parse_command_line(argv) -> argparse.Namespace:
    parser = new_parser("shard-plot", __doc__)
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="log files (--log-file) or tensorboard logdirs (--tensorboard-logdir)")
    parser.add_argument("--output", "-o", default="curves.svg", help="the SVG file to write (default: curves.svg)")
    parser.add_argument("--metrics", default="", help="comma-separated stats to draw (default: loss, ppl, lr, "
                                                      "gnorm, loss_scale, wps and memory, those recorded)")
    parser.add_argument("--names", default="", help="comma-separated names of the runs in the legend (default: "
                                                    "their file names)")
    parser.add_argument("--mark", action="append", default=[], metavar="UPDATE=LABEL",
                        help="a vertical line at UPDATE labelled LABEL in every panel, e.g. --mark '120=stop / "
                             "resume' (repeatable)")
    return parser.parse_args(argv)


def parse_marks(marks: List[str]) -> List[Tuple[float, str]]:
    """--mark UPDATE=LABEL values as (update, label)."""
    parsed = []
    for mark in marks:
        update, _, label = mark.partition("=")
        try:
            parsed.append((float(update), label.strip()))
            if not math.isfinite(parsed[-1][0]):
                raise ValueError(update)
        except ValueError:
            raise ConfigError(f"--mark {mark!r}: give an update number, '=', and a label, e.g. --mark "
                              "'120=stop / resume'.") from None
    return parsed


@cli_entry("shard-plot")
def main(argv):
    args = parse_command_line(argv)
    if not args.output.endswith(".svg"):
        raise ConfigError(f"--output {args.output!r}: shard-plot writes SVG (any browser opens it); name the "
                          "file *.svg. PNG would need matplotlib, which shardtrain does not depend on.")
    names = args.names.split(",") if args.names else [None] * len(args.runs)
    if len(names) != len(args.runs):
        raise ConfigError(f"--names gives {len(names)} name(s) for {len(args.runs)} run(s); give one per run, "
                          "comma-separated, or leave it out.")
    marks = parse_marks(args.mark)
    runs = [read_run(path, name) for path, name in zip(args.runs, names)]
    metrics = choose_metrics(runs, args.metrics)
    for path, run in zip(args.runs, runs):
        print(f"{path}: {found(run)}")
    for note in no_training_notes(args.runs, runs) + nonfinite_notes(runs, metrics, args.metrics):
        print(f"shard-plot: note: {note}", file=sys.stderr)
    try:
        atomic_write_bytes(args.output, svg.render(runs, metrics, marks).encode("utf-8"))
    except OSError as e:
        raise ConfigError(f"Cannot write --output {args.output!r}: {e.strerror or e}. Pass a path in a "
                          "writable directory.") from None
    print(f"wrote {args.output} ({', '.join(metrics)} of {len(runs)} run(s))")
    return args.output


def found(run: Run) -> str:
    """The metrics of each record kind, in the order first recorded: "train_inner loss, ppl; valid loss"."""
    tags = {}
    for tag, metric in run.series:
        tags.setdefault(tag, []).append(metric)
    return "; ".join(f"{tag} {', '.join(metrics)}" for tag, metrics in tags.items())


def no_training_notes(paths: List[str], runs: List[Run]) -> List[str]:
    """A run drawn without its training curve (validation only): why, and what to pass."""
    return [f"{path} has no training curve, only {', '.join(sorted({tag for tag, _ in run.series}))}: it holds no "
            f"interval records (train_inner). {NO_INTERVAL_RECORDS}"
            for path, run in zip(paths, runs) if not any(tag == TRAIN for tag, _ in run.series)]


def nonfinite_notes(runs, drawn: List[str], wanted: str) -> List[str]:
    """What is not drawn because its values are nan or inf: a panel left out (one of the default
    panels, or one --metrics asked for) and a run's curve missing from a panel drawn."""
    asked = [m.strip() for m in wanted.split(",") if m.strip()] if wanted else list(DEFAULT_METRICS)
    notes = []
    for metric in asked:
        bad = {run.name: run.nonfinite[metric] for run in runs
               if run.nonfinite.get(metric) and metric not in run.metrics()}
        if not bad:
            continue
        values = ", ".join(f"{count} in {name}" for name, count in bad.items())
        if metric in drawn:
            notes.append(f"the {metric} panel has no curve for {', '.join(bad)}: every {metric} value recorded "
                         f"there ({values}) is nan or inf.")
        else:
            notes.append(f"no {metric} panel: every {metric} value recorded ({values}) is nan or inf, which "
                         "cannot be drawn (a run that diverged logs nan).")
    return notes


def choose_metrics(runs, wanted: str) -> List[str]:
    found = sorted({m for run in runs for m in run.metrics()})
    if not wanted:
        chosen = [m for m in DEFAULT_METRICS if m in found]
        if "gb_peak_alloc" in chosen and "gb_rss" in chosen:  # on a GPU the device's memory is the one that binds
            chosen.remove("gb_rss")
        return chosen or found
    chosen = [m.strip() for m in wanted.split(",") if m.strip()]
    # a metric recorded only as nan/inf has no panel; nonfinite_notes says so
    drawable = [m for m in chosen if m in found or not any(run.nonfinite.get(m) for run in runs)]
    if not drawable:
        raise ConfigError(f"--metrics {', '.join(chosen)}: every value recorded is nan or inf, so there is nothing "
                          f"to draw. Recorded with finite values: {', '.join(found)}.")
    chosen = drawable
    unknown = [m for m in chosen if m not in found]
    if unknown:
        where = "this run" if len(runs) == 1 else "these runs"
        raise ConfigError(f"--metrics {', '.join(unknown)}: not recorded in {where}. Recorded: {', '.join(found)}.")
    return chosen


if __name__ == "__main__":
    main()
