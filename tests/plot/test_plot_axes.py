"""shard-plot's axes and runs, read back from the SVG it writes (issue 31, item 10): a unit on every axis
that has one, validation throughput on a panel of its own, runs that coincide both visible, tick labels on
every axis (a log axis inside one decade too), enough ticks for a warmup-then-decay learning rate."""
import math

import pytest

from shardtrain.cli import plot
from shardtrain.trainer.metrics.logging_setup import setup_logging, teardown_logging
from shardtrain.trainer.metrics.progress import build_progress_bar
from svg_panels import read_panels

TESTS_ROOM = "shardtrain.plot"  # it drives the commands: its imports cannot say which room it tests


def write_records(path, train, valid=(), log_format="simple"):
    """Interval records and validation summaries through the real progress bar into a --log-file."""
    setup_logging(str(path))
    try:
        bar = build_progress_bar(range(10), log_format=log_format, log_interval=1, epoch=1, is_tty=False)
        for stats in train:
            bar.log(stats, tag="train_inner", step=stats["num_updates"])
        for stats in valid:
            bar.print(stats, tag="valid", step=stats["num_updates"])
        bar.close()
    finally:
        teardown_logging()
    return str(path)


def draw(tmp_path, *argv):
    out = str(tmp_path / "curves.svg")
    plot.main([*argv, "--output", out])
    with open(out) as f:
        return read_panels(f.read())


def lr_at(u):
    """inverse_sqrt: a warmup to 3.85e-4 over 100 updates, then the decay."""
    return 3.85e-4 * min(u / 100, math.sqrt(100 / u))


TRAIN = [{"loss": 9.0 - u / 200, "ppl": 2 ** (9.0 - u / 200), "lr": lr_at(u), "gnorm": 1.0 + u / 1000,
          "wps": 18000.0 + u, "ups": 2.0, "train_wall": 4.5, "clip": 10.0, "gb_rss": 0.40 + u / 10 ** 5,
          "num_updates": u} for u in range(30, 1001, 10)]
VALID = [{"loss": 8.0 - u / 400, "ppl": 2 ** (8.0 - u / 400), "wps": 56000.0 + u, "num_updates": u}
         for u in range(200, 1001, 200)]


@pytest.fixture
def run_log(tmp_path):
    return write_records(tmp_path / "train.log", TRAIN, VALID)


def test_every_axis_with_a_unit_names_it(run_log, tmp_path):
    panels = draw(tmp_path, run_log, "--metrics", "loss,ppl,lr,gnorm,wps,ups,train_wall,clip,gb_rss")
    assert {title: panel.unit for title, panel in panels.items()} == {
        "loss": "bits/token", "ppl (log scale)": None, "lr": None, "gnorm": None, "wps (training)": "words/s",
        "wps (validation)": "words/s", "ups": "updates/s", "train_wall": "s", "clip": "%", "gb_rss": "GiB"}


def test_validation_throughput_has_a_panel_of_its_own(run_log, tmp_path):
    panels = draw(tmp_path, run_log)
    assert list(panels) == ["loss", "ppl (log scale)", "lr", "gnorm", "wps (training)", "wps (validation)", "gb_rss"]
    assert [c["tag"] for c in panels["wps (training)"].curves] == ["train_inner"]
    assert [c["tag"] for c in panels["wps (validation)"].curves] == ["valid"]
    # each on its own scale: 18,030..19,000 and 56,200..57,000 words/s
    assert panels["wps (training)"].yticks == ["18,000", "18,200", "18,400", "18,600", "18,800", "19,000"]
    assert panels["wps (validation)"].yticks == ["56,200", "56,400", "56,600", "56,800", "57,000"]
    # a loss is a loss: training and validation stay on one panel, to be compared
    assert sorted(c["tag"] for c in panels["loss"].curves) == ["train_inner", "valid"]


def test_two_identical_runs_are_both_drawn_distinguishably(run_log, tmp_path):
    panels = draw(tmp_path, run_log, run_log, "--names", "first,second")
    for title, panel in panels.items():
        for tag in {c["tag"] for c in panel.curves}:
            first, second = ([c for c in panel.curves if c["run"] == run and c["tag"] == tag][0]
                             for run in ("first", "second"))
            assert first["points"] == second["points"], title  # they coincide...
            assert first["stroke"] != second["stroke"], title  # ...in two colours
            assert first["width"] > second["width"], title  # the one below shows at the edges of the one above
        marks = {run: [m for m in panel.markers if m["run"] == run] for run in ("first", "second")}
        assert len(marks["first"]) >= 2 and len(marks["second"]) >= 2, title
        assert {m["shape"] for m in marks["first"]}.isdisjoint({m["shape"] for m in marks["second"]}), title
        assert {m["d"] for m in marks["first"]}.isdisjoint({m["d"] for m in marks["second"]}), title
        assert {m["at"] for m in marks["first"]}.isdisjoint({m["at"] for m in marks["second"]}), title


def test_every_axis_has_tick_labels(run_log, tmp_path):
    panels = draw(tmp_path, run_log, "--metrics", "loss,ppl,lr,gnorm,wps,ups,train_wall,clip,gb_rss")
    for title, panel in panels.items():
        assert len(panel.yticks) >= 2 and len(panel.xticks) >= 2, (title, panel.yticks, panel.xticks)
        assert len(set(panel.yticks)) == len(panel.yticks) and len(set(panel.xticks)) == len(panel.xticks)
    assert panels["loss"].xticks == ["0", "200", "400", "600", "800", "1,000"]
    assert panels["gnorm"].yticks == ["1.0", "1.2", "1.4", "1.6", "1.8", "2.0"]
    flat = panels["ups"]  # 2.0 at every update: a band around it
    assert flat.yticks == ["1.8", "1.9", "2.0", "2.1", "2.2"]


@pytest.mark.parametrize("low,high,labels", [
    (60.0, 90.0, ["60", "70", "80", "90"]),  # inside one decade: its multiples 6..9 x 10^1
    (2.0, 9.0, ["2", "3", "4", "5", "6", "7", "9"]),  # 2..9 x 10^0; 8 has a grid line but no room for a label
    (61.0, 64.0, ["61", "62", "63", "64"]),  # not even two multiples: round values
    (30.0, 1500.0, ["50", "100", "200", "500", "1,000"]),  # 1, 2 and 5 times the powers of ten
])
def test_a_log_axis_has_tick_labels_however_narrow(low, high, labels, tmp_path):
    steps = 20
    train = [{"ppl": low * (high / low) ** (k / steps), "num_updates": k + 1} for k in range(steps + 1)]
    panels = draw(tmp_path, write_records(tmp_path / "ppl.log", train), "--metrics", "ppl")
    assert panels["ppl (log scale)"].yticks == labels


def test_a_warmup_then_decay_learning_rate_gets_at_least_four_labels(run_log, tmp_path):
    """1.17e-4 up to 3.85e-4 and down to 1.22e-4: steps of 1e-4 would label only 2e-4 and 3e-4."""
    panels = draw(tmp_path, run_log, "--metrics", "lr")
    assert panels["lr"].yticks == ["1.5e-4", "2.0e-4", "2.5e-4", "3.0e-4", "3.5e-4"]


def test_shard_plot_says_what_each_file_holds(tmp_path, capsys):
    train = [{"loss": 5.0, "wps": 1000.0, "lr": 1e-3, "gb_rss": 0.4, "num_updates": u} for u in (1, 2)]
    valid = [{"loss": 4.0, "ppl": 16.0, "num_updates": 2}]
    simple = write_records(tmp_path / "simple.log", train, valid, "simple")
    json = write_records(tmp_path / "json.log", train, valid, "json")
    draw(tmp_path, simple, json)
    out = [line for line in capsys.readouterr().out.splitlines() if line.startswith(str(tmp_path))]
    assert out == [f"{simple}: train_inner loss, wps, lr, gb_rss; valid epoch, loss, ppl",
                       f"{json}: train_inner epoch, loss, wps, lr, gb_rss; valid epoch, loss, ppl"]


def test_a_log_without_training_records_says_why_and_what_to_pass(tmp_path, capsys):
    """Such a log is what --log-format tqdm left in --log-file before issue 31: epoch summaries and
    validation, no interval records."""
    train = [{"loss": 5.0, "num_updates": u} for u in (1, 2)]
    full = write_records(tmp_path / "full.log", train, [{"loss": 4.0, "num_updates": 2}])
    with open(full) as f:
        lines = [line for line in f if "| train_inner |" not in line]
    summary = "2026-11-23 23:07:30 | INFO | train | epoch 001 | loss 5 | num_updates 2\n"
    (tmp_path / "tqdm.log").write_text("".join(lines) + summary)
    panels = draw(tmp_path, str(tmp_path / "tqdm.log"))
    assert [c["tag"] for panel in panels.values() for c in panel.curves] == ["valid"]  # validation is drawn
    err = capsys.readouterr().err
    assert "tqdm.log has no training curve, only valid: it holds no interval records (train_inner)." in err
    for said in ("--log-format tqdm", "--log-interval", "--tensorboard-logdir", "--log-format simple (or json)"):
        assert said in err, said
    # only epoch summaries: nothing to draw, the same reason, nothing written
    (tmp_path / "summaries.log").write_text(summary)
    with pytest.raises(SystemExit) as info:
        plot.main([str(tmp_path / "summaries.log"), "--output", str(tmp_path / "none.svg")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err and not (tmp_path / "none.svg").exists()
    assert "holds 1 epoch summaries but no interval records (train_inner)" in err and "--log-format tqdm" in err


def test_x_labels_that_would_overlap_are_spaced_out(tmp_path):
    """50,000 updates: a label every 10,000 would not fit side by side (6 labels of 6 characters in 216 px)."""
    train = [{"loss": 5.0 - u / 10 ** 5, "num_updates": u} for u in range(500, 50001, 500)]
    panels = draw(tmp_path, write_records(tmp_path / "long.log", train), "--metrics", "loss")
    assert panels["loss"].xticks == ["0", "20,000", "40,000"]
