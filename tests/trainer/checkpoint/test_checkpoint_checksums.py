"""A damaged checkpoint is refused by every loading command, before any value is used.

Each kind of file of both formats (a single .pt; a sharded directory's shard .distcp, .metadata and
extra.pt) gets a flipped bit, a truncation and (sharded) the same-named file of the run's earlier checkpoint;
then resume, --finetune-from-model, shard-validate, shard-generate and shard-consolidate (both ways) must
each exit 2 with one paragraph naming the checkpoint and the file, write nothing, and never reach a NaN.
"""
import json
import logging
import os
import shutil

import pytest
import torch

from shardtrain.cli import consolidate, generate, train, validate
from shardtrain.cli import verify as verify_cli
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.checkpoint.save_dir_lock import LOCK_NAME
from shardtrain.trainer.checkpoint.choose import verify_checkpoint
from shardtrain.trainer.checkpoint.integrity import NO_CHECKSUMS
from shardtrain.trainer.launch.start import call_main
from equivalence_mains import train_and_record
from st_testutils import make_space_data_bin, shard_verify_output

MODEL = ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
         "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16"]
TRAIN = [*MODEL, "--batch-size", "4", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.5", "--lr-scheduler",
         "fixed", "--disable-validation", "--cpu", "--threads", "1", "--log-format", "none"]
TORCH_ADVICE = ("Check the documentation of torch.load", "weights_only=False", "WeightsUnpickler")


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("sums")), n_words=8, train_tokens=4000,
                               valid_tokens=200, line_len=40)


@pytest.fixture(scope="module")
def saves(data_bin, tmp_path_factory):
    """{"sharded": save dir of a 2-rank fully_sharded run, "single": of a 1-rank pytorch_ddp run}, each with
    checkpoints at updates 2 and 4 (checkpoint_last: 4)."""
    root = tmp_path_factory.mktemp("saves")
    cfg = parse_train_args([data_bin, *TRAIN, "--ddp-backend", "fully_sharded", "--distributed-world-size", "2",
                            "--max-update", "4", "--save-interval-updates", "2", "--save-dir", str(root / "sharded"),
                            "--heartbeat-timeout", "60"])
    call_main(cfg, train_and_record)
    train.main([data_bin, *TRAIN, "--ddp-backend", "pytorch_ddp", "--max-update", "4", "--save-interval-updates",
                "2", "--save-dir", str(root / "single")])
    return {"sharded": root / "sharded", "single": root / "single"}


def flip(path, earlier):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # the middle: tensor bytes in a shard or a .pt, pickled values in extra.pt
    path.write_bytes(bytes(data))


def truncate(path, earlier):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def swap(path, earlier):
    """The same-named file of the run's checkpoint at update 2: the same size, other bytes."""
    shutil.copyfile(earlier / path.name, path)


SHARDED_FILES = ["__0_0.distcp", ".metadata", "extra.pt"]
CASES = ([("sharded", f, d) for f in SHARDED_FILES for d in (flip, truncate, swap)]
         + [("single", "checkpoint_last.pt", d) for d in (flip, truncate)])


def damaged_copy(saves, form, file, damage, tmp_path):
    copy = tmp_path / "ck"
    shutil.copytree(saves[form], copy, symlinks=True)  # copies: the single file's hard links become files
    if form == "sharded":
        target = copy / os.readlink(copy / "checkpoint_last") / file
        damage(target, copy / "checkpoint_1_2")
        return copy, copy / "checkpoint_last"
    damage(copy / file, None)
    return copy, copy / file


def refused(main, argv, capsys, *named):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err[-2000:]
    assert "is damaged" in err and all(n in err for n in named), err[-2000:]
    assert "Traceback" not in err and "NaN" not in err and "nan" not in err
    assert not any(advice in err for advice in TORCH_ADVICE)
    return err


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.parametrize("form,file,damage", CASES, ids=[f"{f}-{n}-{d.__name__}" for f, n, d in CASES])
def test_every_loading_command_refuses_a_damaged_checkpoint(form, file, damage, data_bin, saves, tmp_path, capsys):
    save, checkpoint = damaged_copy(saves, form, file, damage, tmp_path)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in save.iterdir() if p.name != LOCK_NAME)
    backend = "fully_sharded" if form == "sharded" else "pytorch_ddp"
    named = (str(checkpoint), file)
    # resume (--restore-file checkpoint_last, the default): refused, nothing saved
    refused(train.main, [data_bin, *TRAIN, "--ddp-backend", backend, "--max-update", "6", "--save-dir", str(save)],
            capsys, *named)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in save.iterdir() if p.name != LOCK_NAME) == before
    refused(train.main, [data_bin, *TRAIN, "--ddp-backend", backend, "--max-update", "6", "--save-dir",
                         str(tmp_path / "ft"), "--finetune-from-model", str(checkpoint)], capsys, *named)
    assert not [p for p in (tmp_path / "ft").glob("checkpoint*")]
    refused(validate.main, [data_bin, "--path", str(checkpoint), "--cpu"], capsys, *named)
    refused(generate.main, [data_bin, "--path", str(checkpoint), "--cpu", "--prompt", "a"], capsys, *named)
    out = tmp_path / ("out.pt" if form == "sharded" else "out")
    refused(consolidate.main, [str(checkpoint), str(out)], capsys, *named)
    assert not os.path.lexists(out) and not list(tmp_path.glob(".out*"))


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
def test_intact_checkpoints_verify_and_the_message_lists_earlier_ones(saves, tmp_path, capsys):
    last = saves["sharded"] / "checkpoint_last"
    # every file the save wrote is listed: both ranks' shards, .metadata, extra.pt and the marker
    listed = set(json.loads((last / "CHECKSUMS").read_text())["files"])
    assert listed == {p.name for p in last.iterdir()} - {"CHECKSUMS"} and len(listed) == 5
    assert verify_checkpoint(str(last)).startswith("intact (5 files, ")
    assert verify_checkpoint(str(saves["single"] / "checkpoint_last.pt")).startswith("intact (")
    save, checkpoint = damaged_copy(saves, "sharded", "__1_0.distcp", flip, tmp_path)
    with pytest.raises(Exception, match=r"(?s)__1_0\.distcp does not match its checksum.*checkpoint_1_2"):
        verify_checkpoint(str(checkpoint))


def strip_checksums(directory):
    """A sharded checkpoint as shardtrain wrote it before checksums: no CHECKSUMS, no "checksums" in COMPLETE."""
    os.remove(directory / "CHECKSUMS")
    info = json.loads((directory / "COMPLETE").read_text())
    del info["checksums"]
    (directory / "COMPLETE").write_text(json.dumps(info))


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
def test_checkpoints_without_checksums_load_with_a_notice(data_bin, saves, tmp_path, capsys, caplog):
    copy = tmp_path / "old"
    shutil.copytree(saves["sharded"], copy, symlinks=True)
    strip_checksums(copy / os.readlink(copy / "checkpoint_last"))
    assert verify_checkpoint(str(copy / "checkpoint_last")) == NO_CHECKSUMS
    legacy = tmp_path / "legacy.pt"  # torch's pre-zip format holds no CRCs
    torch.save(torch.load(saves["single"] / "checkpoint_last.pt", weights_only=True), legacy,
               _use_new_zipfile_serialization=False)
    assert verify_checkpoint(str(legacy)) == NO_CHECKSUMS
    with caplog.at_level(logging.WARNING):
        validate.main([data_bin, "--path", str(copy / "checkpoint_last"), "--cpu"])
        validate.main([data_bin, "--path", str(legacy), "--cpu"])
    notices = [r.getMessage() for r in caplog.records if "carries no checksums" in r.getMessage()]
    assert len(notices) == 2 and all("\n" not in n for n in notices)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
def test_a_missing_manifest_is_damage_when_the_marker_says_it_was_written(saves, tmp_path):
    copy = tmp_path / "ck"
    shutil.copytree(saves["sharded"], copy, symlinks=True)
    os.remove(copy / "checkpoint_last" / "CHECKSUMS")
    with pytest.raises(Exception, match="CHECKSUMS is missing"):
        verify_checkpoint(str(copy / "checkpoint_last"))


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
def test_a_damaged_old_checkpoint_never_echoes_torch_advice(data_bin, saves, tmp_path, capsys):
    """Without checksums, a damaged extra.pt reaches torch's reader, whose error advises weights_only=False."""
    import zipfile

    copy = tmp_path / "old"
    shutil.copytree(saves["sharded"], copy, symlinks=True)
    directory = copy / os.readlink(copy / "checkpoint_last")
    strip_checksums(directory)
    extra = directory / "extra.pt"
    with zipfile.ZipFile(extra) as source:
        entries = {i.filename: source.read(i) for i in source.infolist()}
    with zipfile.ZipFile(extra, "w", zipfile.ZIP_STORED) as out:
        for name, data in entries.items():  # an opcode torch's weights-only unpickler refuses
            out.writestr(name, b"\x80\x02I1\n." if name.endswith("data.pkl") else data)
    with pytest.raises(SystemExit) as info:
        validate.main([data_bin, "--path", str(copy / "checkpoint_last"), "--cpu"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "extra.pt" in err and "damaged" in err and "Traceback" not in err
    assert not any(advice in err for advice in TORCH_ADVICE), err


def test_a_shard_torch_cannot_unpickle_never_echoes_torch_advice():
    """A damaged shard of an old checkpoint (no checksums) fails inside DCP with torch's weights-only error."""
    import pickle

    from shardtrain.core.errors import CheckpointError
    from shardtrain.trainer.checkpoint.dcp_errors import reading_shards

    with pytest.raises(CheckpointError) as info, reading_shards("ck"):
        raise pickle.UnpicklingError("Weights only load failed. In PyTorch 2.6, we changed the default value of "
                                     "the `weights_only` argument ... Re-running `torch.load` with `weights_only` "
                                     "set to `False` will likely succeed ... weights_only=False")
    assert "UnpicklingError" in str(info.value) and "damaged" in str(info.value)
    assert not any(advice in str(info.value) for advice in TORCH_ADVICE + ("weights_only",)), info.value


def test_a_peer_lost_while_loading_is_not_called_damage():
    """gloo's words when the other rank died while the ranks read a checkpoint together (seen in the
    self-healing soak): the paragraph names the lost rank and never tells the user the checkpoint is damaged."""
    from shardtrain.trainer.checkpoint.dcp_errors import RankLostError, reading_shards

    gloo = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[127.0.0.1]:4322. This is typically caused by a remote worker crashing.")
    with pytest.raises(RankLostError) as info, reading_shards("ck"):
        raise RuntimeError(gloo)
    assert "another rank was lost" in str(info.value) and "damaged" not in str(info.value).replace(
        "Nothing says the checkpoint is damaged", "")


def shard_verify(path, capsys):
    """(exit status, {name: state}) of ``shard-verify path``."""
    code, out = shard_verify_output(path, capsys)
    return code, {os.path.basename(line.split(": ", 1)[0]): line.split(": ", 1)[1] for line in out.splitlines()}


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.parametrize("form", ["sharded", "single"])
def test_shard_verify_checks_every_checkpoint_of_a_save_dir(form, saves, tmp_path, capsys):
    code, states = shard_verify(saves[form], capsys)
    assert code == 0, states
    assert sum(s.startswith("intact") for s in states.values()) == 2, states  # updates 2 and 4
    assert all(s.startswith(("intact", "the same checkpoint as")) for s in states.values()), states
    copy, damaged = damaged_copy(saves, form, "__0_0.distcp" if form == "sharded" else "checkpoint_last.pt", flip,
                                 tmp_path)
    code, states = shard_verify(copy, capsys)
    name = os.readlink(damaged) if form == "sharded" else damaged.name  # the directory the alias points to
    assert code == 1 and states[name].startswith("DAMAGED") and "is damaged" in states[name], states
    assert states["checkpoint_1_2" if form == "sharded" else "checkpoint_1_2.pt"].startswith("intact"), states
    assert shard_verify(damaged, capsys)[0] == 1  # one checkpoint, named directly


def test_shard_verify_checks_a_data_bin_and_refuses_what_is_neither(data_bin, tmp_path, capsys):
    code, states = shard_verify(data_bin, capsys)
    assert code == 0 and list(states.values())[0].startswith("intact"), states
    copy = tmp_path / "data-bin"
    shutil.copytree(data_bin, copy)
    flip(copy / "train.bin", None)
    code, states = shard_verify(copy, capsys)
    assert code == 1 and list(states.values())[0].startswith("DAMAGED"), states
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "missing", tmp_path / "empty"):
        with pytest.raises(SystemExit) as info:
            verify_cli.main([str(path)])
        assert info.value.code == 2 and "Traceback" not in capsys.readouterr().err
