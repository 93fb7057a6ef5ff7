"""Checkpoints never run code on load: every file a checkpoint is read from
(.pt, extra.pt, DCP's .metadata, DCP's non-tensor values) is refused when it
pickles anything but tensor data, through the real CLIs, and the payload
(an ``os.mkdir``) never runs.

Each payload is first shown to be live: plain unpickling runs it."""
import io
import os
import pickle
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp

from shardtrain.cli import consolidate, train, validate
from shardtrain.trainer.checkpoint.checksums import MANIFEST, file_entry, manifest_bytes, read_manifest
from shardtrain.trainer.checkpoint.safe_loading import METADATA_GLOBALS
from st_testutils import cli_refusal, small_data_bin, tiny_model_flags, train_both_forms


class Payload:
    """Unpickles as ``os.mkdir(path)``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return small_data_bin(str(tmp_path_factory.mktemp("safe")))


@pytest.fixture(scope="module")
def saved(data_bin, tmp_path_factory):
    """checkpoint_last of one update: single file (pytorch_ddp) and sharded (fully_sharded)."""
    saves = train_both_forms(data_bin, tmp_path_factory.mktemp("saves"), "--max-update", "1")
    return {backend: os.path.join(save, "checkpoint_last" + (".pt" if backend == "pytorch_ddp" else ""))
            for backend, save in saves.items()}


def refused(main, argv, capsys) -> str:
    return cli_refusal(main, argv, capsys)[1]


def assert_live(blob: bytes, marker, loader=pickle.loads):
    """The payload in ``blob`` runs when unpickled without restrictions."""
    loader(blob)
    assert os.path.isdir(marker)
    os.rmdir(marker)


def torch_saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.mark.slow
def test_single_file_checkpoint_with_a_payload(saved, data_bin, tmp_path, capsys):
    marker = tmp_path / "ran"
    state = torch.load(saved["pytorch_ddp"], weights_only=True)
    state["extra_state"] = {"note": Payload(marker)}
    blob = torch_saved(state)
    assert_live(blob, marker, lambda b: torch.load(io.BytesIO(b), weights_only=False))
    bad = tmp_path / "bad.pt"
    bad.write_bytes(blob)
    for main, argv in [(validate.main, [data_bin, "--path", str(bad)]),
                       (train.main, [data_bin, *tiny_model_flags(), "--cpu", "--max-update", "2",
                                     "--save-dir", str(tmp_path / "save"), "--restore-file", str(bad)]),
                       (consolidate.main, [str(bad), str(tmp_path / "out")])]:
        err = refused(main, argv, capsys)
        assert "posix.mkdir" in err and "could run arbitrary code" in err, err
    assert not marker.exists() and not (tmp_path / "save").exists() and not (tmp_path / "out").exists()


def tampered_copy(src, tmp_path, name, data: bytes):
    """A copy of the sharded checkpoint ``src`` with ``name`` replaced by ``data`` and its checksum forged to
    match: checksums catch damage, not an attacker who rewrites CHECKSUMS too (or deletes it, as in an old
    checkpoint), so what is tested here is the loader's own refusal behind them."""
    dest = tmp_path / "ck"
    shutil.copytree(os.path.realpath(src), dest)
    (dest / name).write_bytes(data)
    files = read_manifest(str(dest))
    files[name] = file_entry(str(dest / name))
    (dest / MANIFEST).write_bytes(manifest_bytes(files))
    return dest


@pytest.mark.slow
def test_sharded_metadata_with_a_payload(saved, data_bin, tmp_path, capsys):
    marker = tmp_path / "ran"
    src = saved["fully_sharded"]
    metadata = pickle.loads(open(os.path.join(src, ".metadata"), "rb").read())
    # a well-formed Metadata with one extra object tucked inside
    metadata.storage_meta.modules = [Payload(marker)]
    blob = pickle.dumps(metadata)
    assert_live(blob, marker)
    ck = tampered_copy(src, tmp_path, ".metadata", blob)
    save = tmp_path / "save"
    for main, argv in [(validate.main, [data_bin, "--path", str(ck)]),
                       (train.main, [data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", "fully_sharded",
                                     "--max-update", "2", "--save-dir", str(save), "--restore-file", str(ck)]),
                       (consolidate.main, [str(ck), str(tmp_path / "out.pt")])]:
        err = refused(main, argv, capsys)
        assert ".metadata contains a pickled posix.mkdir" in err and "could run arbitrary code" in err, err
    assert not marker.exists() and not save.exists() and not (tmp_path / "out.pt").exists()


@pytest.mark.slow
def test_extra_pt_with_a_payload(saved, data_bin, tmp_path, capsys):
    marker = tmp_path / "ran"
    src = saved["fully_sharded"]
    extra = torch.load(os.path.join(src, "extra.pt"), weights_only=True)
    extra["meters"] = Payload(marker)
    ck = tampered_copy(src, tmp_path, "extra.pt", torch_saved(extra))
    err = refused(validate.main, [data_bin, "--path", str(ck)], capsys)
    assert "extra.pt contains a pickled posix.mkdir" in err
    assert not marker.exists()


def test_sharded_value_with_a_payload(tmp_path, capsys):
    """A non-tensor value DCP stores as bytes (DCP's own planner would
    torch.load it with weights_only=False)."""
    marker = tmp_path / "ran"
    ck = tmp_path / "ck"
    dcp.save({"model": {"w": torch.ones(3)}, "optimizer": {"param_groups": [{"lr": Payload(marker)}]}},
             checkpoint_id=str(ck), no_dist=True)
    torch.save({"cfg": {}}, ck / "extra.pt")
    (ck / "COMPLETE").write_text("{}")
    capsys.readouterr()  # DCP's warning when it saves without a process group (once a process): not the refusal
    assert not marker.exists()
    err = refused(consolidate.main, [str(ck), str(tmp_path / "out.pt")], capsys)
    assert "'optimizer.param_groups.0.lr'" in err and "posix.mkdir" in err, err
    assert not marker.exists() and not (tmp_path / "out.pt").exists()


@pytest.mark.slow
def test_truncated_shard_is_a_clear_error(saved, tmp_path, capsys):
    src = saved["fully_sharded"]
    shard = open(os.path.join(src, "__0_0.distcp"), "rb").read()
    ck = tampered_copy(src, tmp_path, "__0_0.distcp", shard[:len(shard) // 2])
    err = refused(consolidate.main, [str(ck), str(tmp_path / "out.pt")], capsys)
    assert "A shard file is missing or damaged" in err and "resume from an earlier checkpoint" in err
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.slow
def test_real_checkpoints_need_nothing_outside_the_allow_list(saved, tmp_path):
    """What shardtrain writes loads through the safe readers; the metadata
    uses only allow-listed globals (not a vacuous list)."""
    src = saved["fully_sharded"]
    consolidate.main([src, str(tmp_path / "out.pt")])  # every value and tensor, through the safe reader
    state = torch.load(tmp_path / "out.pt", weights_only=True)
    assert state["model"] and state["optimizer"]["state"]
    used = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module, name):
            used.add((module, name))
            return super().find_class(module, name)

    Recorder(open(os.path.join(src, ".metadata"), "rb")).load()
    named = {g for g in used if g[0] != "builtins" and not isinstance(getattr(torch, g[1], None), torch.dtype)}
    assert ("torch.distributed.checkpoint.metadata", "Metadata") in named
    assert named <= METADATA_GLOBALS, named - METADATA_GLOBALS
