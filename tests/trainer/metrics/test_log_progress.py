"""Progress bars: fairseq's line shapes, log intervals, tqdm fallback."""
import json
import logging

import pytest
import torch

from shardtrain.core.errors import ConfigError
from shardtrain.trainer.metrics.logging_setup import CONSOLE, FILE, ONLY
from shardtrain.trainer.metrics.progress import JsonBar, SimpleBar, TqdmBar, build_progress_bar, format_stat

STATS = {"loss": 6.2, "ppl": 73.4, "wps": 1520.0, "lr": 0.0005, "num_updates": 10}


@pytest.fixture
def lines(caplog):
    caplog.set_level(logging.INFO, logger="shardtrain.progress")
    def of(tag, where=None):
        """``tag``'s messages; ``where``: only those the console (CONSOLE) or the --log-file (FILE) shows."""
        return [r.getMessage() for r in caplog.records
                if r.name == tag and (where is None or getattr(r, ONLY, where) == where)]
    return of


def _run_epoch(bar, stats=STATS, tag="train_inner"):
    for step, _ in enumerate(bar, start=1):
        bar.log(stats, tag=tag, step=step)


def test_simple_lines_every_interval(lines):
    bar = build_progress_bar(range(100), log_format="simple", log_interval=10, epoch=1)
    _run_epoch(bar)
    got = lines("train_inner")
    assert len(got) == 10
    assert got[0] == "epoch 001:     10 / 100 loss=6.2, ppl=73.4, wps=1520, lr=0.0005, num_updates=10"
    assert got[-1].startswith("epoch 001:    100 / 100 loss=6.2")


def test_simple_summary_line(lines):
    bar = build_progress_bar(range(3), log_format="simple", epoch=2, prefix="valid on 'valid' subset")
    bar.print({"loss": 6.2, "ppl": 73.4}, tag="valid", step=30)
    assert lines("valid") == ["epoch 002 | valid on 'valid' subset | loss 6.2 | ppl 73.4"]
    plain = build_progress_bar(range(3), log_format="simple", epoch=2)
    plain.print({"loss": 6.2}, tag="train", step=30)
    assert lines("train") == ["epoch 002 | loss 6.2"]


def test_json_log_line_has_epoch_and_fractional_update(lines):
    # fairseq's "update" is epochs done: epoch 2, a quarter through, is 1.25
    bar = build_progress_bar(range(100), log_format="json", log_interval=25, epoch=2)
    _run_epoch(bar, {"loss": 6.2, "ppl": 73.4})
    got = lines("train_inner")
    assert got[0] == '{"epoch": 2, "update": 1.25, "loss": "6.2", "ppl": "73.4"}'
    assert [json.loads(line)["update"] for line in got] == [1.25, 1.5, 1.75, 2.0]


def test_json_summary_prefixes_keys_with_tag(lines):
    bar = build_progress_bar(range(3), log_format="json", epoch=3)
    bar.print({"loss": 6.2, "num_updates": 300}, tag="valid", step=300)
    assert json.loads(lines("valid")[0]) == {"epoch": 3, "valid_loss": "6.2", "valid_num_updates": "300"}


def test_log_interval_and_due():
    bar = build_progress_bar(range(5), log_format="simple", log_interval=3)
    assert [s for s in range(10) if bar.due(s)] == [3, 6, 9]


def test_resumed_iterator_counts_on_from_n(lines):
    class Resumed:  # 100 batches of which 50 were consumed before the restart
        n = 50

        def __len__(self):
            return 100

        def __iter__(self):
            return iter(range(50, 100))

    bar = build_progress_bar(Resumed(), log_format="simple", log_interval=1, epoch=1)
    assert next(iter(bar)) == 50
    bar.log({"loss": 1.0}, tag="train_inner", step=51)
    assert lines("train_inner") == ["epoch 001:     51 / 100 loss=1"]


def test_tqdm_falls_back_to_simple_without_tty(lines):
    bar = build_progress_bar(range(4), log_format="tqdm", log_interval=2, epoch=1, is_tty=False)
    assert type(bar) is SimpleBar
    _run_epoch(bar, {"loss": 6.2})
    assert lines("train_inner") == ["epoch 001:      2 / 4 loss=6.2", "epoch 001:      4 / 4 loss=6.2"]


def test_tqdm_bar_postfix_and_summary(lines, capsys):
    bar = build_progress_bar(range(4), log_format="tqdm", log_interval=2, epoch=1, is_tty=True)
    assert type(bar) is TqdmBar
    items = []
    for step, item in enumerate(bar, start=1):
        items.append(item)
        bar.log(STATS, tag="train_inner", step=step)
    assert items == [0, 1, 2, 3]
    assert bar.tqdm.postfix == "loss=6.2, lr=0.0005, wps=1520"
    assert lines("train_inner", CONSOLE) == []  # the bar itself shows progress
    inner = [json.loads(line) for line in lines("train_inner", FILE)]  # the --log-file keeps the records
    assert [r["num_updates"] for r in inner] == ["10", "10"] and [r["update"] for r in inner] == [0.5, 1.0]
    bar.print({"loss": 6.2}, tag="train", step=4)
    bar.close()
    assert lines("train", CONSOLE) == ["epoch 001 | loss 6.2"]
    assert lines("train", FILE) == ['{"epoch": 1, "train_loss": "6.2"}']


def test_none_format_is_silent_on_the_console_only(lines):
    bar = build_progress_bar(range(4), log_format="none", log_interval=1, epoch=1)
    _run_epoch(bar)
    bar.print({"loss": 6.2}, tag="train", step=4)
    assert lines("train_inner", CONSOLE) == [] and lines("train", CONSOLE) == []
    assert len(lines("train_inner", FILE)) == 4 and lines("train", FILE) == ['{"epoch": 1, "train_loss": "6.2"}']


def test_unknown_format_lists_choices():
    with pytest.raises(ConfigError, match="--log-format 'xml'.*json, simple, tqdm, none"):
        build_progress_bar(range(1), log_format="xml")


def test_format_stat_matches_fairseq():
    assert format_stat(0.1) == "0.1"
    assert format_stat(12345678.0) == "1.23457e+07"
    assert format_stat(7) == "7"
    assert format_stat(torch.tensor([1, 2])) == [1, 2]
    assert format_stat("x") == "x"


def test_rank_without_info_prints_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="shardtrain.progress")
    bar = build_progress_bar(range(2), log_format="json", log_interval=1, epoch=1)
    _run_epoch(bar)
    assert isinstance(bar, JsonBar) and caplog.records == []
