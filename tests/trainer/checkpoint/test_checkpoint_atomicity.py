"""SIGKILL at any moment of a save never leaves a torn checkpoint under a checkpoint name.

Training saves after every update; each kill waits until the run has saved a
newer update than at the previous kill (so it lands among back-to-back saves of
a running training, never during start-up), then comes after a different short
delay, landing at different points of model/optimizer writes, the extra state,
the COMPLETE marker, the rename and the alias swap. After each kill,
checkpoint_last must load, hold at least the update seen before the kill, and
every visible checkpoint must be complete; a partial directory is never picked,
and naming one explicitly is an error. Each phase is killed deterministically in
test_save_crash_phases.py; this test is the end-to-end check with real signals.
Each run is forked from a forkserver that imported torch and shardtrain once.
"""
import os
import re
import signal
import time

import pytest
import torch

from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.checkpoint.single_file import load_checkpoint
from shardtrain.trainer.checkpoint.sharded import check_complete, load_extra, load_sharded_into
from atomicity_mains import train_quietly
from st_testutils import forkserver_children, make_space_data_bin


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("kill")), n_words=8, train_tokens=20000,
                               valid_tokens=200, line_len=40)


@pytest.fixture(scope="module")
def children():
    with forkserver_children(["shardtrain.cli.train", "shardtrain.trainer.loop", "shardtrain.config.run_config",
                              "shardtrain.trainer.checkpoint.resume", "shardtrain.models.transformer_lm",
                              "shardtrain.tasks.language_modeling", "torch.distributed.checkpoint", "torch._dynamo",
                              "torch.onnx"]) as context:
        yield context


def start(children, data_bin, save_dir, backend):
    argv = [data_bin, "--arch", "transformer_lm",
            "--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "128",
            "--decoder-attention-heads", "2", "--tokens-per-sample", "32", "--batch-size", "4",
            "--save-interval-updates", "1", "--disable-validation", "--max-update", "10000", "--cpu",
            "--threads", "1", "--log-format", "none", "--save-dir", str(save_dir), "--ddp-backend", backend]
    child = children.Process(target=train_quietly, args=(argv,))
    child.start()
    return child


ADVANCE_TIMEOUT = 600  # seconds for a (re)started run to save a newer update: start-up is ~6 s idle, far more loaded
KILL_DELAYS = (0.013, 0.057, 0.101, 0.149, 0.211)  # after a new save shows: land in different phases of the next ones


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["fully_sharded", "pytorch_ddp"])
def test_kill_during_saves_leaves_a_loadable_checkpoint_last(backend, children, data_bin, tmp_path):
    save, seen = tmp_path / "ck", 0
    for delay in KILL_DELAYS:
        proc = start(children, data_bin, save, backend)  # a fresh run, then resuming from checkpoint_last
        try:
            wait_for_a_save_after(seen, proc, save, backend)
            time.sleep(delay)
        finally:
            kill_group(proc)
        seen = check_save_dir(save, backend, at_least=seen + 1)


def kill_group(proc):
    """SIGKILL the run's session (it made its own), or the run itself if it died before making it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        proc.kill()
    proc.join()


def wait_for_a_save_after(update, proc, save, backend):
    """Poll until checkpoint_last names an update later than ``update``."""
    deadline = time.time() + ADVANCE_TIMEOUT
    while last_update(save, backend) <= update:
        assert proc.is_alive(), f"training exited ({proc.exitcode}) before saving past update {update}"
        assert time.time() < deadline, f"no save after update {update} in {ADVANCE_TIMEOUT} s"
        time.sleep(0.05)


def last_update(save, backend) -> int:
    """The update checkpoint_last names (0 before the first save), from names alone:
    the directory a link points to, or the interval file a hard link shares."""
    try:
        if backend == "fully_sharded":
            return int(re.fullmatch(r"checkpoint_\d+_(\d+)", os.readlink(save / "checkpoint_last")).group(1))
        last = os.stat(save / "checkpoint_last.pt")
    except FileNotFoundError:
        return 0
    for entry in save.iterdir():
        found = re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", entry.name)
        try:
            if found and os.path.samestat(last, os.stat(entry)):
                return int(found.group(1))
        except FileNotFoundError:  # a temporary, renamed away meanwhile
            continue
    return 0


def check_save_dir(save, backend, at_least: int) -> int:
    """Check every name; return the update checkpoint_last holds (at least ``at_least``)."""
    sharded = backend == "fully_sharded"
    if sharded:
        updates = load_extra(str(save / "checkpoint_last"))["train_state"]["num_updates"]
    else:
        updates = load_checkpoint(str(save / "checkpoint_last.pt"))["train_state"]["num_updates"]
    for entry in save.iterdir():
        if entry.name.startswith("checkpoint") and sharded:  # every visible name is whole
            check_complete(str(entry))
        elif entry.name.startswith("checkpoint"):
            torch.load(entry, weights_only=True)
        elif entry.name != "config.yaml":  # the run's resolved config, written after each save
            assert entry.name.startswith("."), entry  # only hidden temporaries besides
            if entry.is_dir() and not (entry / "COMPLETE").exists():  # killed before its marker
                with pytest.raises(CheckpointError, match="incomplete"):
                    check_complete(str(entry))
    assert updates >= at_least, f"checkpoint_last went back to update {updates} (update {at_least - 1} was saved)"
    return updates


@pytest.mark.parametrize("name,files", [("checkpoint_1_5", [".metadata", "extra.pt", "__0_0.distcp"]),
                                        (".checkpoint_1_5.partial", ["__0_0.distcp"])])
def test_a_directory_without_complete_is_refused(name, files, tmp_path):
    """Every reader refuses it before reading a shard, with the one-paragraph error."""
    path = tmp_path / name
    path.mkdir()
    for file in files:
        (path / file).write_bytes(b"written")
    if "extra.pt" in files:  # whole and loadable: only the marker is missing
        torch.save({"train_state": {"num_updates": 5}}, path / "extra.pt")
    for read in (check_complete, load_extra, lambda p: load_sharded_into(p, None, None)):
        with pytest.raises(CheckpointError) as refused:
            read(str(path))
        message = str(refused.value)
        assert f"{str(path)!r} is incomplete (no COMPLETE marker)" in message and "\n" not in message, message
