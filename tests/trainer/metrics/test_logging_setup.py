"""setup_logging: format, rank levels, log file, idempotence, no leaks."""
import errno
import logging
import re

import pytest

from shardtrain.core.errors import ConfigError
from shardtrain.trainer.metrics.logging_setup import setup_logging, teardown_logging
from shardtrain.trainer.metrics.progress import build_progress_bar

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (INFO|WARNING) \| ([\w.]+) \| (.*)$")


@pytest.fixture(autouse=True)
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    teardown_logging()
    assert root.handlers == handlers and root.level == level


def _parsed(text):
    return [LINE.match(line).groups() for line in text.splitlines() if line]


def test_stdout_and_log_file_get_fairseq_format(tmp_path, capsys):
    log_file = tmp_path / "train.log"
    setup_logging(log_file=str(log_file), rank=0)
    bar = build_progress_bar(range(2), log_format="simple", log_interval=1, epoch=1)
    for step, _ in enumerate(bar, start=1):
        bar.log({"loss": 6.2}, tag="train_inner", step=step)
    bar.print({"loss": 6.2}, tag="train", step=2)
    logging.getLogger("shardtrain.trainer").info("done training")
    teardown_logging()  # closes the file
    expected = [
        ("INFO", "train_inner", "epoch 001:      1 / 2 loss=6.2"),
        ("INFO", "train_inner", "epoch 001:      2 / 2 loss=6.2"),
        ("INFO", "train", "epoch 001 | loss 6.2"),
        ("INFO", "shardtrain.trainer", "done training"),
    ]
    assert _parsed(log_file.read_text()) == expected
    assert _parsed(capsys.readouterr().out) == expected


def test_other_ranks_log_warnings_only(capsys):
    setup_logging(rank=1)
    log = logging.getLogger("shardtrain.trainer")
    log.info("hidden")
    log.warning("shown")
    bar = build_progress_bar(range(1), log_format="simple", epoch=1)
    bar.print({"loss": 1.0}, tag="train", step=1)
    assert _parsed(capsys.readouterr().out) == [("WARNING", "shardtrain.trainer", "shown")]


def test_setup_twice_replaces_its_handlers(tmp_path, capsys):
    root = logging.getLogger()
    before = len(root.handlers)
    setup_logging(log_file=str(tmp_path / "a.log"))
    setup_logging(log_file=str(tmp_path / "b.log"))
    assert len(root.handlers) == before + 2
    logging.getLogger("shardtrain").info("once")
    teardown_logging()
    assert capsys.readouterr().out.count("once") == 1
    assert (tmp_path / "a.log").read_text() == ""
    assert "once" in (tmp_path / "b.log").read_text()


def test_unwritable_log_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="--log-file .*Create its directory"):
        setup_logging(log_file=str(tmp_path / "missing" / "train.log"))


def test_log_file_that_is_a_directory_is_named(tmp_path):
    with pytest.raises(ConfigError, match="is a directory; pass a file path such as"):
        setup_logging(log_file=str(tmp_path))


class _FullDisk:
    """A stream on a full disk: every write fails as the kernel says ENOSPC."""
    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        pass


def test_a_full_disk_under_the_log_file_is_said_once_and_training_logs_on(tmp_path, capsys):
    log_file = tmp_path / "train.log"
    setup_logging(log_file=str(log_file), rank=0)
    handler = next(h for h in logging.getLogger().handlers if getattr(h, "baseFilename", None) == str(log_file))
    logging.getLogger("shardtrain.test").info("before the disk filled")
    handler.stream = _FullDisk()
    for update in range(165):
        logging.getLogger("shardtrain.test").info(f"update {update}")
    out, err = capsys.readouterr()
    assert err == ""  # no "--- Logging error ---" with a traceback, once or 165 times
    notices = [line for line in out.splitlines() if "cannot be written" in line]
    assert len(notices) == 1 and "No space left on device" in notices[0] and "training goes on" in notices[0]
    assert "update 0" in out and "update 164" in out  # the console still gets every line
    assert log_file.read_text().count("\n") == 1 and "before the disk filled" in log_file.read_text()
