"""Issue 37: a first Ctrl-C (or SIGTERM/SIGUSR1) stops a validation under way at its next batch, then saves
checkpoint_last and stops, without recording the partial pass (no valid record, no best checkpoint, no
--patience count). It waited for the whole pass (over 240 s in the report). In-process, 1 rank, real signals
sent from inside the step that is under way; the exit status is the one docs/checkpoints.md states."""
import os
import re
import signal
import sys

import pytest

from shardtrain.cli import train
from shardtrain.trainer.trainer import Trainer
from st_testutils import json_records, last_checkpoint_state, make_space_data_bin, tiny_model_flags

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "checkpoints.md")


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("data")), train_tokens=4000, valid_tokens=2000)


def documented_first_ctrl_c_status() -> int:
    with open(DOC) as f:
        text = " ".join(f.read().split())
    stated = re.findall(r"a first Ctrl-C[^.]*? exits? (\d+)", text)
    assert len(stated) == 1, "docs/checkpoints.md states shard-train's first Ctrl-C exit status once"
    return int(stated[0])


def run_signalled(data_bin, tmp_path, monkeypatch, step: str, call: int, signum: int, *flags) -> tuple:
    """shard-train as its console script runs it, sending ``signum`` to itself during the ``call``-th
    ``step`` (valid_step or train_step); returns (exit status, valid_step calls, log text)."""
    calls = {"valid_step": 0, "train_step": 0}
    original = getattr(Trainer, step)

    def signalling(self, *args):
        calls[step] += 1
        if calls[step] == call:
            os.kill(os.getpid(), signum)  # handled between bytecodes: the step itself goes on
        return original(self, *args)

    counted = Trainer.valid_step

    def counting(self, *args):
        calls["valid_step"] += step != "valid_step"
        return counted(self, *args)

    monkeypatch.setattr(Trainer, step, signalling)
    if step != "valid_step":
        monkeypatch.setattr(Trainer, "valid_step", counting)
    log = tmp_path / "train.log"
    monkeypatch.setattr(sys, "argv", ["shard-train", data_bin, *tiny_model_flags(), "--batch-size-valid", "1",
                                      "--max-update", "100", "--save-dir", str(tmp_path / "ck"),
                                      "--log-file", str(log), *flags])
    try:
        train.main()  # as the console script: its return value is the exit status
        status = 0
    except SystemExit as e:
        status = e.code
    return status, calls["valid_step"], log.read_text()


def test_a_first_ctrl_c_during_validation_stops_it_at_the_next_batch_and_saves(data_bin, tmp_path, monkeypatch,
                                                                               capfd):
    status, valid_steps, log = run_signalled(data_bin, tmp_path, monkeypatch, "valid_step", 2, signal.SIGINT,
                                             "--validate-interval-updates", "2")
    assert status == 0 == documented_first_ctrl_c_status()
    assert valid_steps == 2  # the batch under way is finished, no other (the pass has about 60)
    stopped = re.search(r"validation on 'valid' stopped after 2 of (\d+) batches by Ctrl-C: not recorded", log)
    assert stopped and int(stopped.group(1)) > 50, log[-3000:]
    assert json_records(str(tmp_path / "train.log"), "valid") == []  # the partial pass is no validation
    state = last_checkpoint_state(tmp_path / "ck")
    assert state["train_state"]["num_updates"] == 2 and state["train_state"]["best"] is None
    assert sorted(n for n in os.listdir(tmp_path / "ck") if n.endswith(".pt")) == ["checkpoint_last.pt"]  # no best
    assert "stopped by Ctrl-C at update 2 with checkpoint_last saved" in log
    assert "validation batch" in capfd.readouterr().err  # the first Ctrl-C's line says what it finishes


def test_a_stop_asked_during_an_update_skips_the_validation_it_would_wait_for(data_bin, tmp_path, monkeypatch):
    """Stopping is a reason to validate (fairseq validates before the last save): a signal that came during
    the update now stops that validation before its first batch."""
    status, valid_steps, log = run_signalled(data_bin, tmp_path, monkeypatch, "train_step", 3, signal.SIGTERM)
    assert (status, valid_steps) == (0, 0)
    assert "validation on 'valid' stopped after 0 of " in log and "by SIGTERM/SIGUSR1: not recorded" in log
    state = last_checkpoint_state(tmp_path / "ck")
    assert state["train_state"]["num_updates"] == 3 and state["train_state"]["best"] is None
    assert not (tmp_path / "ck" / "checkpoint_best.pt").exists()
