"""shard-plot says what it cannot draw: a panel whose every value is nan or inf (a diverged run's loss),
and a run's curve missing from a panel that other runs fill (issue 29, red-team item 9)."""
import math
import xml.etree.ElementTree as ET

import pytest

from shardtrain.cli import plot
from shardtrain.trainer.metrics.logging_setup import setup_logging, teardown_logging
from shardtrain.trainer.metrics.progress import build_progress_bar

TESTS_ROOM = "shardtrain.plot"  # it drives the commands: its imports cannot say which room it tests


def write_log(path, losses):
    """Interval records through the real json progress bar: lr finite, loss as given."""
    setup_logging(str(path))
    try:
        bar = build_progress_bar(range(10), log_format="json", log_interval=1, epoch=1, is_tty=False)
        for u, loss in enumerate(losses, start=1):
            bar.log({"loss": loss, "lr": 1e-3 * u, "num_updates": u}, tag="train_inner", step=u)
        bar.close()
    finally:
        teardown_logging()
    return str(path)


def panels(svg_path):
    """The titles of the panels drawn."""
    texts = [t.text for t in ET.parse(svg_path).getroot().iter("{http://www.w3.org/2000/svg}text")]
    return {t for t in texts if t in plot.DEFAULT_METRICS}


def test_an_all_nan_panel_is_left_out_with_a_note(tmp_path, capsys):
    diverged = write_log(tmp_path / "diverged.log", [math.nan, math.nan, math.inf])
    out = str(tmp_path / "curves.svg")
    plot.main([diverged, "--output", out])
    err = capsys.readouterr().err
    assert panels(out) == {"lr"}
    assert ("shard-plot: note: no loss panel: every loss value recorded (3 in diverged.log) is nan or inf, "
            "which cannot be drawn") in err


def test_a_run_whose_curve_is_all_nan_is_named_in_the_panel_others_fill(tmp_path, capsys):
    diverged = write_log(tmp_path / "diverged.log", [math.nan, math.nan])
    good = write_log(tmp_path / "good.log", [5.0, 4.0])
    out = str(tmp_path / "curves.svg")
    plot.main([good, diverged, "--output", out, "--names", "good,bad"])
    err = capsys.readouterr().err
    assert panels(out) == {"loss", "lr"}
    assert ("shard-plot: note: the loss panel has no curve for bad: every loss value recorded there (2 in bad) "
            "is nan or inf.") in err and "good" not in err


def test_metrics_asked_for_that_are_only_nan_are_refused_in_one_paragraph(tmp_path, capsys):
    diverged = write_log(tmp_path / "diverged.log", [math.nan])
    with pytest.raises(SystemExit) as info:
        plot.main([diverged, "--output", str(tmp_path / "c.svg"), "--metrics", "loss"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert "--metrics loss: every value recorded is nan or inf, so there is nothing to draw" in err
    assert not (tmp_path / "c.svg").exists()
