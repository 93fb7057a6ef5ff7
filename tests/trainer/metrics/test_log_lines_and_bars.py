"""Log records and progress bars share one terminal without writing over each other."""
import io
import logging
import re
import sys

from shardtrain.trainer.metrics.logging_setup import setup_logging, teardown_logging
from shardtrain.trainer.metrics.progress import build_progress_bar

RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| INFO \| shardtrain\.trainer\.loop \| begin training epoch 1$")


def test_a_record_logged_under_a_live_bar_gets_a_line_of_its_own(monkeypatch):
    terminal = io.StringIO()  # stdout and stderr of one terminal: the bar on stderr, records on stdout
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    setup_logging()
    try:
        bar = build_progress_bar(range(3), log_format="tqdm", epoch=1, is_tty=True)
        for _ in bar:
            logging.getLogger("shardtrain.trainer.loop").info("begin training epoch 1")
        bar.close()
    finally:
        teardown_logging()
    # A terminal shows, of each line, what follows its last carriage return; the bar redraws with \r.
    segments = [s for line in terminal.getvalue().split("\n") for s in line.split("\r")]
    with_record = [s for s in segments if "begin training" in s]
    assert len(with_record) == 3 and all(RECORD.match(s) for s in with_record), with_record
    assert any("epoch 001" in s and "it/s" in s for s in segments)  # the bar was drawn
