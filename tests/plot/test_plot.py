"""shard-plot: records read back from each log format and from tensorboard, drawn where they belong."""
import math
import os

import pytest

from shardtrain.cli import plot
from shardtrain.plot import axes
from shardtrain.plot.records import read_run
from svg_panels import read_panels
from shardtrain.trainer.metrics.logging_setup import setup_logging, teardown_logging
from shardtrain.trainer.metrics.progress import build_progress_bar
from shardtrain.trainer.metrics.tensorboard import TensorboardWriter

# Two epochs of a resumed run as the trainer logs them: interval records, then validation summaries.
TRAIN = [{"loss": 9.5 - u / 10, "ppl": 2 ** (9.5 - u / 10), "lr": 1e-3 * u, "gnorm": 1.0 + u / 100,
          "wps": 1000.0 + u, "gb_rss": 0.4 + u / 1000, "num_updates": u} for u in range(2, 21, 2)]
VALID = [{"loss": 8.0 - u / 20, "ppl": 2 ** (8.0 - u / 20), "wps": 500.0, "num_updates": u} for u in (10, 20)]


def write_log(path, log_format):
    """The records through the real progress bars into a --log-file."""
    setup_logging(str(path))
    try:
        for epoch, (train, valid) in enumerate([(TRAIN[:5], VALID[:1]), (TRAIN[5:], VALID[1:])], start=1):
            bar = build_progress_bar(range(10), log_format=log_format, log_interval=2, epoch=epoch, is_tty=False)
            for stats in train:
                bar.log(stats, tag="train_inner", step=stats["num_updates"])
            bar.print({"loss": 1.0, "num_updates": train[-1]["num_updates"]}, tag="train", step=0)  # not a curve
            for stats in valid:
                bar.print(stats, tag="valid", step=stats["num_updates"])
            bar.close()
    finally:
        teardown_logging()


def expected(records, metric):
    return [(float(r["num_updates"]), pytest.approx(r[metric], rel=1e-5)) for r in records if metric in r]


@pytest.mark.parametrize("log_format", ["simple", "json", "tqdm"])
def test_every_log_format_reads_back(log_format, tmp_path):
    path = tmp_path / "train.log"
    write_log(path, log_format)
    run = read_run(str(path))
    for metric in ("loss", "ppl", "lr", "gnorm", "wps", "gb_rss"):
        assert run.series[("train_inner", metric)] == expected(TRAIN, metric), metric
    assert run.series[("valid", "loss")] == expected(VALID, "loss")
    assert not any(tag == "train" for tag, _ in run.series)  # epoch summaries are not a curve


def test_tensorboard_events_read_back(tmp_path):
    with TensorboardWriter(str(tmp_path / "tb")) as writer:
        for stats in TRAIN:
            writer.add_scalars(stats, "train_inner", stats["num_updates"])
        for stats in VALID:
            writer.add_scalars(stats, "valid", stats["num_updates"])
    run = read_run(str(tmp_path / "tb"))
    assert run.series[("train_inner", "lr")] == expected(TRAIN, "lr")
    assert run.series[("valid", "ppl")] == expected(VALID, "ppl")


def test_a_resumed_run_repeating_updates_keeps_the_later_values(tmp_path):
    path = tmp_path / "train.log"
    write_log(path, "simple")
    text = path.read_text()
    path.write_text(text + text.replace("loss=9.3,", "loss=7.7,"))  # the run resumed from before update 2
    assert read_run(str(path)).series[("train_inner", "loss")][0] == (2.0, pytest.approx(7.7))


def test_curves_are_drawn_where_their_values_are(tmp_path):
    """Each panel maps updates and values onto pixels by one affine map (log10 for ppl), the same for
    every curve in it: a point drawn at another curve's value or update would break it."""
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    write_log(a, "simple")
    write_log(b, "json")
    b.write_text(b.read_text().replace('"loss": "9.3"', '"loss": "12"'))  # run b differs at one point
    out = tmp_path / "curves.svg"
    assert plot.main([str(a), str(b), "--output", str(out), "--names", "a,b"]) == str(out)
    panels = read_panels(out.read_text())
    runs = {name: read_run(str(path), name) for name, path in (("a", a), ("b", b))}
    metrics = plot.choose_metrics(list(runs.values()), "")
    assert metrics == ["loss", "ppl", "lr", "gnorm", "wps", "gb_rss"]
    # wps: training and validation apart
    assert list(panels) == ["loss", "ppl (log scale)", "lr", "gnorm", "wps (training)", "wps (validation)", "gb_rss"]
    drawn = {(c["run"], c["tag"], c["metric"]) for panel in panels.values() for c in panel.curves}
    assert drawn == {(r, t, m) for r in "ab" for (t, m) in runs[r].series if m in metrics}
    for panel in panels.values():
        left, top, width, height = panel.area
        pairs = [(value, pixel) for c in panel.curves
                 for value, pixel in zip(runs[c["run"]].series[(c["tag"], c["metric"])], c["points"])]
        for axis in (0, 1):
            values = [(math.log10(v[axis]) if panel.metric == "ppl" and axis else v[axis]) for v, _ in pairs]
            pixels = [p[axis] for _, p in pairs]
            lo, hi = values.index(min(values)), values.index(max(values))
            if values[lo] == values[hi]:  # validation's flat wps: one line across the middle of its panel
                assert pixels == [pytest.approx(top + height / 2, abs=0.01)] * len(pixels)
                continue
            scale = (pixels[hi] - pixels[lo]) / (values[hi] - values[lo])
            assert (scale > 0) == (axis == 0)  # x grows right, values grow up
            for value, pixel in zip(values, pixels):
                assert pixel == pytest.approx(pixels[lo] + (value - values[lo]) * scale, abs=0.02)
        assert all(left <= p[0] <= left + width and top <= p[1] <= top + height for _, p in pairs)
        # markers sit on their run's curve points
        for marker in panel.markers:
            assert any(marker["at"] == pytest.approx(p, abs=0.01) for c in panel.curves if c["run"] == marker["run"]
                       for p in c["points"]), marker


def test_ticks_are_round_and_inside():
    assert axes.nice_ticks(0.3, 9.7) == [2, 4, 6, 8]
    assert axes.nice_ticks(0, 1000) == [0, 200, 400, 600, 800, 1000]
    assert axes.nice_ticks(0, 1000, at_least=3) == [0, 500, 1000]
    assert [round(10 ** t, 6) for t in axes.log_ticks(math.log10(30), math.log10(1500))] == [50, 100, 200, 500, 1000]


@pytest.mark.parametrize("argv,says", [
    (["{tmp}/missing.log"], "does not exist"),
    (["{tmp}/empty.log"], "holds no training records"),
    (["{tmp}/a.log", "--metrics", "loss,bleu"], "--metrics bleu: not recorded in this run. Recorded: epoch, gb_rss, "),
    (["{tmp}/a.log", "--names", "x,y"], "--names gives 2 name(s) for 1 run(s)"),
    (["{tmp}/a.log", "--output", "{tmp}/c.png"], "name the file *.svg"),
    (["{tmp}/a.log", "--output", "{tmp}/no/such/dir/c.svg"], "Cannot write --output"),
])
def test_mistakes_are_one_paragraph_and_write_nothing(argv, says, tmp_path, capsys):
    write_log(tmp_path / "a.log", "simple")
    (tmp_path / "empty.log").write_text("2026-11-23 23:07:00 | INFO | shardtrain.data | nothing to plot\n")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(SystemExit) as info:
        plot.main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert info.value.code == 2 and says in err and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path)) == before
