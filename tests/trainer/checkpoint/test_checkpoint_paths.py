"""Every file a sharded checkpoint refers to lies inside its directory and is checksummed: names in CHECKSUMS
or in DCP's .metadata that leave it ('../x', '/x', links) and shard files CHECKSUMS does not list are refused
with one paragraph by shard-verify (exit 1) and by every loading command (exit 2), before anything is read.

The forged checkpoints here carry matching checksums (an attacker rewrites CHECKSUMS too): what is tested is
the rule behind the checksums. Each outside file is an intact copy of the real one, so reading it would pass."""
import dataclasses
import os
import pickle
import shutil

import pytest

from shardtrain.cli import consolidate, train, validate
from shardtrain.cli import verify as verify_cli
from shardtrain.trainer.checkpoint.checksums import MANIFEST, file_entry, manifest_bytes, read_manifest
from st_testutils import cli_refusal, make_space_data_bin, tiny_model_flags

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    data = make_space_data_bin(str(root), n_words=6, train_tokens=3000, valid_tokens=300, line_len=30, seed=3)
    train.main([data, *tiny_model_flags(), "--cpu", "--ddp-backend", "fully_sharded", "--max-update", "1",
                "--save-dir", str(root / "save"), "--log-format", "none"])
    return data, os.path.realpath(root / "save" / "checkpoint_last")


def copy_of(saved, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(saved[1], ck)
    return ck


def relist(ck, files):
    """Rewrite CHECKSUMS with ``files`` (name -> entry), its own checksum forged to match."""
    (ck / MANIFEST).write_bytes(manifest_bytes(files))


def rename_in_metadata(ck, new_name):
    """.metadata names ``new_name`` instead of __0_0.distcp (and CHECKSUMS lists the new .metadata)."""
    metadata = pickle.loads((ck / ".metadata").read_bytes())  # our own file: plain pickle is fine here
    metadata.storage_data = {k: dataclasses.replace(v, relative_path=new_name) for k, v in
                             metadata.storage_data.items()}
    (ck / ".metadata").write_bytes(pickle.dumps(metadata))
    files = read_manifest(str(ck))
    if files is not None:
        relist(ck, {**files, ".metadata": file_entry(str(ck / ".metadata"))})


def outside_in_manifest(ck, tmp_path):
    shutil.copyfile(ck / "__0_0.distcp", tmp_path / "outside.distcp")
    files = read_manifest(str(ck))
    relist(ck, {**files, "../outside.distcp": file_entry(str(tmp_path / "outside.distcp"))})
    return "../outside.distcp is named in CHECKSUMS but is not a file of the checkpoint directory"


def absolute_in_manifest(ck, tmp_path):
    shutil.copyfile(ck / "__0_0.distcp", tmp_path / "outside.distcp")
    files = read_manifest(str(ck))
    relist(ck, {**files, str(tmp_path / "outside.distcp"): file_entry(str(tmp_path / "outside.distcp"))})
    return f"{tmp_path / 'outside.distcp'} is named in CHECKSUMS but is not a file of the checkpoint directory"


def shard_is_a_link(ck, tmp_path):
    shutil.move(ck / "__0_0.distcp", tmp_path / "outside.distcp")
    os.symlink(tmp_path / "outside.distcp", ck / "__0_0.distcp")
    return "__0_0.distcp is a symbolic link (named in CHECKSUMS)"


def outside_in_metadata(ck, tmp_path):
    (tmp_path / "x").mkdir()
    shutil.copyfile(ck / "__0_0.distcp", tmp_path / "x" / "__0_0.distcp")
    rename_in_metadata(ck, "../x/__0_0.distcp")
    return "../x/__0_0.distcp is named in .metadata but is not a file of the checkpoint directory"


def unlisted_shard(ck, tmp_path):
    shutil.copyfile(ck / "__0_0.distcp", ck / "__9_0.distcp")  # intact bytes, but never checksummed
    rename_in_metadata(ck, "__9_0.distcp")
    return "__9_0.distcp is a shard file .metadata names but CHECKSUMS does not list"


def unlisted_extra(ck, tmp_path):
    files = read_manifest(str(ck))
    del files["extra.pt"]
    relist(ck, files)
    return "extra.pt is read on load but CHECKSUMS does not list it"


CASES = [outside_in_manifest, absolute_in_manifest, shard_is_a_link, outside_in_metadata, unlisted_shard,
         unlisted_extra]


@pytest.mark.parametrize("forge", CASES)
def test_a_checkpoint_that_refers_outside_itself_is_refused(forge, saved, tmp_path, capsys):
    data, _ = saved
    ck = copy_of(saved, tmp_path)
    expected = forge(ck, tmp_path)
    with pytest.raises(SystemExit) as info:
        verify_cli.main([str(ck)])
    out = capsys.readouterr().out
    assert info.value.code == 1 and f"Checkpoint {ck} is refused: {expected}" in out, out
    for main, argv in [(validate.main, [data, "--path", str(ck), "--cpu"]),
                       (consolidate.main, [str(ck), str(tmp_path / "out.pt")])]:
        err = cli_refusal(main, argv, capsys)[1]
        assert f"is refused: {expected}" in err and "Nothing was read from it" in err, err
    assert not (tmp_path / "out.pt").exists()


def test_an_old_checkpoint_without_checksums_is_held_to_its_directory_too(saved, tmp_path, capsys):
    """No CHECKSUMS (written before them): nothing can be listed, but .metadata must still name its own files."""
    data, _ = saved
    ck = copy_of(saved, tmp_path)
    os.remove(ck / MANIFEST)
    (ck / "COMPLETE").write_text('{"format": "shardtrain-dcp-1"}')
    expected = outside_in_metadata(ck, tmp_path)
    with pytest.raises(SystemExit):
        verify_cli.main([str(ck)])
    assert expected in capsys.readouterr().out
    err = cli_refusal(consolidate.main, [str(ck), str(tmp_path / "out.pt")], capsys)[1]
    assert expected in err, err
    # the reader refuses on its own too (the gate DCP reads through), whoever calls it
    from shardtrain.core.errors import CheckpointError
    from shardtrain.trainer.checkpoint.safe_loading import SafeFileSystemReader

    with pytest.raises(CheckpointError, match=r"is refused: \.\./x/__0_0\.distcp is named in \.metadata"):
        SafeFileSystemReader(str(ck))
