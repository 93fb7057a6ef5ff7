"""``shard-plot RUN [RUN ...] --output curves.svg``: training and validation curves of one or more runs.

A RUN is a log file written with ``shard-train --log-file`` (any ``--log-format`` but ``none``) or a
``--tensorboard-logdir``. Each metric gets a panel (x: updates); each run a colour; training is solid,
validation dashed. By default the panels are loss, ppl, lr, gnorm, loss_scale, wps and memory (gb_rss,
or gb_peak_alloc on a GPU), those the runs have; ``--metrics`` picks any recorded stat.
"""
import argparse
from typing import List

from shardtrain.cli.errors import cli_entry
from shardtrain.config.flags import new_parser
from shardtrain.core.errors import ConfigError
from shardtrain.core.fileio import atomic_write_bytes
from shardtrain.plot import svg
from shardtrain.plot.records import read_run

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
    return parser.parse_args(argv)


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
    runs = [read_run(path, name) for path, name in zip(args.runs, names)]
    metrics = choose_metrics(runs, args.metrics)
    try:
        atomic_write_bytes(args.output, svg.render(runs, metrics).encode("utf-8"))
    except OSError as e:
        raise ConfigError(f"Cannot write --output {args.output!r}: {e.strerror or e}. Pass a path in a "
                          "writable directory.") from None
    print(f"wrote {args.output} ({', '.join(metrics)} of {len(runs)} run(s))")
    return args.output


def choose_metrics(runs, wanted: str) -> List[str]:
    found = sorted({m for run in runs for m in run.metrics()})
    if not wanted:
        chosen = [m for m in DEFAULT_METRICS if m in found]
        if "gb_peak_alloc" in chosen and "gb_rss" in chosen:  # on a GPU the device's memory is the one that binds
            chosen.remove("gb_rss")
        return chosen or found
    chosen = [m.strip() for m in wanted.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in found]
    if unknown:
        where = "this run" if len(runs) == 1 else "these runs"
        raise ConfigError(f"--metrics {', '.join(unknown)}: not recorded in {where}. Recorded: {', '.join(found)}.")
    return chosen


if __name__ == "__main__":
    main()
