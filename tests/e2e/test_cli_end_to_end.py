"""End to end through the CLI entry points: preprocess, train, resume, validate, generate."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from shardtrain.data.indexed_dataset import MMapIndexedDataset
from shardtrain.cli import generate, train, validate
from shardtrain.trainer.checkpoint.save_dir_lock import LOCK_NAME
from st_testutils import json_records, make_space_data_bin, tiny_model_flags

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("e2e")), n_words=12, train_tokens=20000,
                               valid_tokens=2600, line_len=50, seed=1)


def run_train(data_bin, save_dir, *extra):
    log = save_dir + ".log"
    train.main([data_bin, *tiny_model_flags(), "--dropout", "0.1", "--attention-dropout", "0.1",
                "--save-dir", save_dir, "--log-file", log, "--lr", "0.003", *extra])
    return log


def weights(path):
    return torch.load(path, weights_only=True)["model"]


def test_resume_mid_epoch_is_exact(data_bin, tmp_path):
    """N updates in one run == N/2, restart, N/2 (dropout on, mid-epoch, accumulation)."""
    common = ["--update-freq", "2", "--clip-norm", "0.5", "--optimizer", "adam",
              "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "3"]
    straight = str(tmp_path / "straight")
    log = run_train(data_bin, straight, "--max-update", "8", *common)
    split = str(tmp_path / "split")
    run_train(data_bin, split, "--max-update", "4", *common)
    log2 = run_train(data_bin, split, "--max-update", "8", *common)

    full = [r["loss"] for r in json_records(log, "train_inner")]
    halves = [r["loss"] for r in json_records(log2, "train_inner")]
    assert len(full) == 8 and len(halves) == 8  # the log file of the split run holds both halves
    assert full == halves
    a, b = weights(f"{straight}/checkpoint_last.pt"), weights(f"{split}/checkpoint_last.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the epoch really was interrupted mid-way: 8 updates x 2 batches is less than one epoch
    state = torch.load(f"{split}/checkpoint_last.pt", weights_only=True)
    assert state["train_iterator"]["iterations_in_epoch"] == 16 and state["train_iterator"]["epoch"] == 1


@pytest.mark.flag_effect("--save-dir")
def test_checkpoint_names_keep_policy_and_validate_generate(data_bin, tmp_path, capsys):
    save = str(tmp_path / "ck")
    log = run_train(data_bin, save, "--max-epoch", "2", "--save-interval-updates", "5",
                    "--keep-interval-updates", "2", "--batch-size", "64")
    names = sorted(n for n in os.listdir(save) if n.endswith(".pt"))
    assert "checkpoint_last.pt" in names and "checkpoint_best.pt" in names
    assert "checkpoint1.pt" in names and "checkpoint2.pt" in names
    interval = sorted(n for n in names if n.count("_") == 2)
    assert len(interval) == 2, names  # --keep-interval-updates 2 pruned the older ones
    updates = torch.load(f"{save}/checkpoint_last.pt", weights_only=True)["train_state"]["num_updates"]
    kept = sorted(int(n[:-len(".pt")].split("_")[2]) for n in interval)
    # the newest two: the last interval save is under 10 updates back (an epoch's end takes no interval name)
    assert kept[1] - kept[0] in (5, 10) and updates - kept[1] < 10, (kept, updates)
    # no temporary files left (the run lock stays: see shardtrain/trainer/checkpoint/save_dir_lock.py)
    assert not [n for n in os.listdir(save) if n.startswith(".") and n != LOCK_NAME]
    valid = json_records(log, "valid")
    assert len(valid) >= 2 and "valid_loss" in valid[-1]

    results = validate.main([data_bin, "--path", f"{save}/checkpoint_last.pt"])
    assert abs(results["valid"]["loss"] - valid[-1]["valid_loss"]) < 1e-3
    # fairseq's valid_wpb and valid_bsz: means per batch of the split's tokens and 32-token samples, so
    # both give the same whole number of batches (more than one here), in training's record and shard-validate's.
    tokens = int(MMapIndexedDataset(os.path.join(data_bin, "valid")).sizes.sum())
    samples = math.ceil(tokens / 32)
    for got in ({k[len("valid_"):]: v for k, v in valid[-1].items()}, results["valid"]):
        batches = round(samples / got["bsz"])
        assert batches > 1 and samples / got["bsz"] == pytest.approx(batches, abs=0.01)
        assert tokens / got["wpb"] == pytest.approx(batches, abs=0.01) and got["wps"] > 0

    out = generate.main([data_bin, "--path", f"{save}/checkpoint_last.pt", "--prompt", "w1 w2",
                         "--max-len", "5"])
    assert out[0].startswith("w1 w2") and len(out[0].split()) <= 7
    assert re.search(r"^H-0\t-?[\d.]+\tw1 w2", capsys.readouterr().out, re.M)


def test_validate_and_generate_show_bars_on_a_terminal(data_bin, tmp_path, capsys, monkeypatch):
    save = str(tmp_path / "ck")
    run_train(data_bin, save, "--max-update", "2", "--batch-size", "64")
    capsys.readouterr()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # as on a terminal
    validate.main([data_bin, "--path", f"{save}/checkpoint_last.pt"])
    generate.main([data_bin, "--path", f"{save}/checkpoint_last.pt", "--prompt", "w1 w2", "--max-len", "5"])
    out, err = capsys.readouterr()
    assert "valid on 'valid' subset:" in err and "generating:" in err  # tqdm's bars, on stderr
    assert re.search(r"^H-0\t", out, re.M) and "generating" not in out  # stdout stays fairseq's lines


def test_console_entry_points_exit_cleanly_on_bad_input(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    result = subprocess.run([sys.executable, "-m", "shardtrain.cli.train", str(tmp_path / "missing"),
                             "--batch-size", "2", "--save-dir", str(tmp_path / "ck")],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2
    assert "does not exist" in result.stderr and "shard-preprocess" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "ck").exists() or not os.listdir(tmp_path / "ck")


@pytest.mark.flag_effect("--finetune-from-model", "--reset-optimizer", "--reset-dataloader", "--max-update",
                         "--tensorboard-logdir")
def test_finetune_reset_flags_and_tensorboard(data_bin, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    a = str(tmp_path / "a")
    run_train(data_bin, a, "--max-update", "3")
    # --finetune-from-model: the weights of A, counters and optimizer fresh (a tiny lr keeps weights ~A's)
    b, tb = str(tmp_path / "b"), str(tmp_path / "tb")
    run_train(data_bin, b, "--max-update", "2", "--finetune-from-model", f"{a}/checkpoint_last.pt",
              "--lr", "1e-12", "--tensorboard-logdir", tb)
    wa, wb = weights(f"{a}/checkpoint_last.pt"), weights(f"{b}/checkpoint_last.pt")
    assert all(torch.allclose(wa[k], wb[k], atol=1e-8) for k in wa)
    state_b = torch.load(f"{b}/checkpoint_last.pt", weights_only=True)
    assert state_b["train_state"]["num_updates"] == 2
    # tensorboard's own reader sees the train_inner and valid scalars
    inner = EventAccumulator(os.path.join(tb, "train_inner"))
    inner.Reload()
    assert [e.step for e in inner.Scalars("loss")] == [1, 2]
    valid = EventAccumulator(os.path.join(tb, "valid"))
    valid.Reload()
    assert {"loss", "ppl"} <= set(valid.Tags()["scalars"])

    # resume A with --reset-optimizer/--reset-lr-scheduler/--reset-meters/--reset-dataloader
    run_train(data_bin, a, "--max-update", "5", "--reset-optimizer", "--reset-lr-scheduler", "--reset-meters",
              "--reset-dataloader")
    state = torch.load(f"{a}/checkpoint_last.pt", weights_only=True)
    assert state["train_state"]["num_updates"] == 5  # the update count continues
    steps = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {2}  # a fresh Adam took two steps
    assert state["train_iterator"]["iterations_in_epoch"] == 2  # the data restarted at the epoch's start


@pytest.mark.flag_effect("--patience", "--stop-time-hours")
def test_patience_and_stop_time_end_training_early(data_bin, tmp_path):
    # a negligible lr keeps the valid loss flat: the first validation sets the best, two more do not beat it
    log = run_train(data_bin, str(tmp_path / "p"), "--max-update", "50", "--lr", "1e-12", "--patience", "2",
                    "--validate-interval-updates", "1", "--save-interval-updates", "1")
    assert [int(r["valid_num_updates"]) for r in json_records(log, "valid")] == [1, 2, 3]
    log = run_train(data_bin, str(tmp_path / "t"), "--max-update", "50", "--stop-time-hours", "1e-9")
    assert len(json_records(log, "train_inner")) == 1
    state = torch.load(str(tmp_path / "t" / "checkpoint_last.pt"), weights_only=True)
    assert state["train_state"]["num_updates"] == 1  # stopping saved a checkpoint to resume from
