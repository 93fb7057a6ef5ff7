"""shard-demo's curves name the run "shard-demo" (not its log file, train.log) and mark the stop and resume
halfway; drawn in-process from a small log written here (the demo itself: tests/e2e/test_demo.py)."""
import json
import re

import pytest

from shardtrain.cli import demo, plot


def _write_log(workdir):
    """train_inner every 20 updates from 20 to 220, valid at 60, 120 and 180 (json log format)."""
    lines = []
    for update in range(20, 221, 20):
        record = {"epoch": 1, "loss": str(14 - update / 40), "ppl": str(2 ** (14 - update / 40)),
                  "num_updates": str(update)}
        lines.append(f"2026-11-23 23:07:15 | INFO | train_inner | {json.dumps(record)}")
        if update % 60 == 0:
            valid = {"epoch": 1, "valid_loss": str(13 - update / 40), "valid_num_updates": str(update)}
            lines.append(f"2026-11-23 23:07:30 | INFO | valid | {json.dumps(valid)}")
    (workdir / demo.LOG_FILE).write_text("\n".join(lines) + "\n")


def test_the_demos_curves_name_the_run_and_mark_the_stop_and_resume(tmp_path, capsys):
    _write_log(tmp_path)
    assert demo.draw_curves(str(tmp_path), 120) == str(tmp_path / "curves.svg")
    curves = (tmp_path / "curves.svg").read_text()
    assert '<text x="37" y="18">shard-demo</text>' in curves  # the legend
    assert 'data-run="shard-demo" data-tag="train_inner" data-metric="loss"' in curves
    assert "train.log" not in curves
    # x of update 120, by hand: updates 20..220 padded by 4% of 200 on each side (12..228) across a plot
    # area 216 px wide from x = 70 in the first panel (300 px to a panel): 70 + 108 px, then 378 + 108
    lines = re.findall(r'<line class="mark" data-update="([^"]+)" x1="([^"]+)" y1="[^"]+" x2="([^"]+)"', curves)
    assert lines == [("120", "178.0", "178.0"), ("120", "478.0", "478.0")]  # the loss and ppl panels
    assert curves.count(">stop / resume</text>") == 2
    assert "ppl" in capsys.readouterr().out


def test_a_mark_outside_the_updates_is_not_drawn_and_a_bad_one_is_refused(tmp_path, capsys):
    _write_log(tmp_path)
    out = str(tmp_path / "c.svg")
    plot.main([str(tmp_path / demo.LOG_FILE), "--output", out, "--mark", "500=later", "--mark", "20=start"])
    curves = (tmp_path / "c.svg").read_text()
    assert 'data-update="500"' not in curves and curves.count('data-update="20"') == 2
    with pytest.raises(SystemExit) as exit_:
        plot.main([str(tmp_path / demo.LOG_FILE), "--output", out, "--mark", "stop=120"])
    assert exit_.value.code == 2
    assert "--mark 'stop=120': give an update number, '=', and a label" in capsys.readouterr().err
