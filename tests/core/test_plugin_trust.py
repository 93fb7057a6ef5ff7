"""Loading a checkpoint never runs code the user did not ask for (core/user_dir.py): the plugin folder a
checkpoint records is imported only when --user-dir names it (or an installed entry point provides its
module), an older checkpoint's relative path is never looked up in the working directory, shard-verify
names the plugin, and a named plugin whose .py files changed since the save loads with a warning.

The checkpoints are forged as whoever edits one would: a built-in model's, re-saved with torch.save
(which recomputes every checksum) with a plugin record pointing at a folder that leaves a mark when
imported. Each test's plugin has a name of its own: an import lasts for the whole test process."""
import copy
import os
import sys
import uuid

import pytest
import torch

from shardtrain.cli import eval_lm, generate, interactive, train, validate
from shardtrain.core.errors import ConfigError
from shardtrain.core.plugins import GROUP
from shardtrain.core.user_dir import files_sha256, for_checkpoint, record
from st_testutils import cli_refusal, shard_verify_output, small_data_bin, tiny_model_flags

# A plugin that registers nothing (the checkpoint's model is built-in) and leaves IMPORTED beside its folder.
MARKING = ("import os\nwith open(os.path.join(os.path.dirname(os.path.dirname(__file__)), 'IMPORTED'), 'a') as f:\n"
           "    f.write(__name__)\n")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(data-bin, the state of a tiny transformer_lm checkpoint trained without a plugin)."""
    root = tmp_path_factory.mktemp("trust")
    data = small_data_bin(str(root / "data"))
    train.main([data, *tiny_model_flags(), "--cpu", "--max-update", "2", "--save-dir", str(root / "ck"),
                "--log-format", "none"])
    return data, torch.load(str(root / "ck" / "checkpoint_last.pt"), weights_only=True)


def marking_plugin(parent):
    """A plugin folder under ``parent`` with a fresh name; -> (folder, its name)."""
    name = f"st_trust_{uuid.uuid4().hex[:10]}"
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(MARKING)
    return folder, name


def forge(state, path, user_dir, header=None):
    """``state`` saved at ``path`` with the config's common.user_dir and ``header`` entries set."""
    forged = copy.deepcopy(state)
    forged["cfg"]["common"]["user_dir"] = user_dir
    forged.update(header or {})
    torch.save(forged, str(path))
    return str(path)


def commands(data, checkpoint):
    return {"shard-validate": (validate.main, [data, "--path", checkpoint, "--log-format", "none"]),
            "shard-eval-lm": (eval_lm.main, [data, "--path", checkpoint]),
            "shard-generate": (generate.main, [data, "--path", checkpoint, "--prompt", "w1"]),
            "shard-interactive": (interactive.main, [data, "--path", checkpoint])}


@pytest.mark.slow
def test_a_recorded_plugin_is_imported_only_when_user_dir_names_it(trained, tmp_path, capsys):
    data, state = trained
    folder, name = marking_plugin(tmp_path / "plugins")
    checkpoint = forge(state, tmp_path / "ck.pt", str(folder), record(str(folder)))
    for prog, (main, argv) in commands(data, checkpoint).items():
        _, err = cli_refusal(main, argv, capsys)
        assert err.startswith(f"{prog}: error: Checkpoint {checkpoint} was trained with the plugin {name!r} from "
                              f"the folder {folder}, and a plugin is imported only when you name it"), err
        assert f"pass --user-dir <folder> with its folder as it is on this machine (--user-dir {folder} if" in err
        assert not (tmp_path / "plugins" / "IMPORTED").exists() and name not in sys.modules
    # named, it is imported and the checkpoint loads
    validate.main([data, "--path", checkpoint, "--log-format", "none", "--user-dir", str(folder)])
    assert (tmp_path / "plugins" / "IMPORTED").read_text() == name


@pytest.mark.slow
def test_an_older_checkpoints_relative_plugin_is_never_looked_up_in_the_working_directory(trained, tmp_path,
                                                                                           capsys, monkeypatch):
    data, state = trained
    folder, name = marking_plugin(tmp_path / "plugins")
    monkeypatch.chdir(tmp_path)  # where "plugins/NAME" would resolve to the folder
    checkpoint = forge(state, tmp_path / "old.pt", f"plugins/{name}")  # no header entry: the config's path only
    _, err = cli_refusal(validate.main, [data, "--path", checkpoint, "--log-format", "none"], capsys)
    assert (f"trained with the plugin {name!r} from the folder plugins/{name} (recorded relative to the folder "
            "training ran in; never looked up in the working directory)") in err, err
    assert not (tmp_path / "plugins" / "IMPORTED").exists() and name not in sys.modules


@pytest.mark.slow
def test_shard_verify_names_the_plugin_a_checkpoint_needs(trained, tmp_path, capsys):
    _, state = trained
    folder, name = marking_plugin(tmp_path / "plugins")
    checkpoint = forge(state, tmp_path / "ck.pt", str(folder), record(str(folder)))
    code, out = shard_verify_output(checkpoint, capsys)
    assert code == 0 and out.startswith(f"{checkpoint}: intact ("), out
    assert out.endswith(f"; needs the plugin {name!r} from the folder {folder}: load it with "
                        "--user-dir <folder>\n"), out
    old = forge(state, tmp_path / "old.pt", "plugins/my_old_plugin")
    assert shard_verify_output(old, capsys)[1].endswith(
        "; needs the plugin 'my_old_plugin' from the folder plugins/my_old_plugin (recorded relative to the folder "
        "training ran in; never looked up in the working directory): load it with --user-dir <folder>\n")
    plain = forge(state, tmp_path / "plain.pt", None)
    assert "plugin" not in shard_verify_output(plain, capsys)[1]
    assert not (tmp_path / "plugins" / "IMPORTED").exists()  # read as data


def test_the_record_hashes_the_plugins_py_files(tmp_path):
    folder = tmp_path / "my_plugin"
    (folder / "sub").mkdir(parents=True)
    (folder / "__init__.py").write_bytes(b"A = 1\n")
    (folder / "sub" / "models.py").write_bytes(b"B = 2\n")
    (folder / "notes.txt").write_text("not code")
    # sha256 of b"__init__.py\0" + 6 as 8 little-endian bytes + b"A = 1\n" + the same for sub/models.py
    expected = "e7f1c0c446ba42efd78f6ddb49704b83a4d557bb6371aeac33f05bbbb071b134"
    assert record(str(folder)) == {"plugin": {"user_dir": str(folder), "module": "my_plugin", "sha256": expected}}
    (folder / "notes.txt").write_text("changed, still not code")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"\0")
    assert files_sha256(str(folder)) == expected
    (folder / "sub" / "models.py").write_bytes(b"B = 3\n")
    assert files_sha256(str(folder)) != expected


def test_a_dangling_py_link_in_the_plugin_folder_is_hashed_not_a_crash(tmp_path):
    folder = tmp_path / "my_plugin"
    folder.mkdir()
    (folder / "__init__.py").write_bytes(b"A = 1\n")
    (folder / "gone.py").symlink_to(tmp_path / "missing.py")
    # sha256 of b"__init__.py\0" + 6 as 8 little-endian bytes + b"A = 1\n" + b"gone.py\0unreadable"
    expected = "299e74fa10ae7a9acb4e8564d2e0ba33cce5acfd604703d9a1a0f6f4666397f6"
    assert record(str(folder))["plugin"]["sha256"] == expected
    (tmp_path / "missing.py").write_bytes(b"")  # the link now reads: an empty file hashes otherwise
    assert files_sha256(str(folder)) != expected


WARNED = ("warning: the plugin folder {folder} (--user-dir) is not the code checkpoint {checkpoint} was saved "
          "with: its .py files changed since")


@pytest.mark.slow
def test_a_named_plugin_whose_files_changed_since_the_save_loads_with_a_warning(trained, tmp_path, caplog):
    data, state = trained
    folder, name = marking_plugin(tmp_path / "plugins")
    checkpoint = forge(state, tmp_path / "ck.pt", str(folder), record(str(folder)))
    argv = [data, "--path", checkpoint, "--log-format", "none", "--user-dir", str(folder)]
    validate.main(argv)
    assert "warning: the plugin folder" not in caplog.text  # unchanged: nothing said
    with open(folder / "__init__.py", "a") as f:
        f.write("CHANGED = True\n")
    assert validate.main(argv)["valid"]["loss"] > 0  # still loads: the user named it
    warned = [r for r in caplog.records if r.levelname == "WARNING" and "plugin folder" in r.getMessage()]
    said = WARNED.format(folder=folder, checkpoint=checkpoint)
    assert [r.getMessage()[:len(said)] for r in warned] == [said], caplog.text


def test_the_plugin_folder_a_checkpoint_is_loaded_with(tmp_path, monkeypatch):
    plugin = tmp_path / "my_plugin"
    plugin.mkdir()
    state = {**record(str(plugin)), "cfg": {"common": {"user_dir": str(plugin)}}}
    assert for_checkpoint("elsewhere/p", state, "ck.pt") == "elsewhere/p"  # the one --user-dir names
    assert for_checkpoint(None, {"cfg": {"common": {"user_dir": None}}}, "ck.pt") is None  # none used
    assert record(None) == {}
    with pytest.raises(ConfigError, match=f"ck.pt was trained with the plugin 'my_plugin' from the folder {plugin}, "
                                          "and a plugin is imported only when you name it"):
        for_checkpoint(None, state, "ck.pt")  # the recorded folder exists, and is not imported unasked
    # an installed entry point of the recorded module provides it: nothing to import by path
    info = tmp_path / "site" / "st_trust_installed-0.1.0.dist-info"  # as pip leaves it; the module is not needed
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: st-trust-installed\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\nmine = my_plugin.setup:register\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert for_checkpoint(None, state, "ck.pt") is None
    with pytest.raises(ConfigError, match="'other_plugin' from the folder /gone/other_plugin"):
        for_checkpoint(None, {"plugin": {"user_dir": "/gone/other_plugin", "module": "other_plugin"}}, "ck.pt")


def test_an_older_checkpoints_folder_ending_in_a_slash_names_its_module():
    state = {"cfg": {"common": {"user_dir": "/old/runs/my_plugin/"}}}  # before the header: the config's value only
    with pytest.raises(ConfigError, match="trained with the plugin 'my_plugin' from the folder /old/runs/my_plugin/"):
        for_checkpoint(None, state, "ck.pt")


def in_a_thread(call, seconds=30):
    """``call()``'s result, or a failure when it still runs after ``seconds`` (a FIFO read waits forever)."""
    import threading

    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(call()), daemon=True)
    worker.start()
    worker.join(timeout=seconds)
    assert outcome, f"still running after {seconds} s"
    return outcome[0]


def test_a_fifo_or_a_device_in_the_plugin_folder_is_hashed_without_reading_it(tmp_path):
    folder = tmp_path / "my_plugin"
    folder.mkdir()
    (folder / "__init__.py").write_bytes(b"A = 1\n")
    os.mkfifo(folder / "notes.py")  # a read waits for a writer forever
    (folder / "zero.py").symlink_to("/dev/zero")  # a read never ends
    # sha256 of b"__init__.py\0" + 6 as 8 little-endian bytes + b"A = 1\n" + b"notes.py\0unreadable"
    # + b"zero.py\0unreadable"
    assert in_a_thread(lambda: files_sha256(str(folder))) == \
        "4fefbcee968c38522cd15124db85f07d609d036070a459f1444055a5f56096cb"


def installed(tmp_path, monkeypatch, module, init):
    """A package ``module`` installed under ``tmp_path/site`` with a 'shardtrain.plugins' entry point."""
    import importlib

    site = tmp_path / "site"
    info = site / f"{module}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\nmine = {module}\n")
    (site / module).mkdir()
    (site / module / "__init__.py").write_text(init)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return site / module


def test_an_installed_plugin_that_is_not_the_recorded_code_loads_with_a_warning(tmp_path, monkeypatch, caplog):
    name = f"st_installed_{uuid.uuid4().hex[:10]}"
    recorded = tmp_path / "trained_with" / name
    recorded.mkdir(parents=True)
    (recorded / "__init__.py").write_text("LOSS_SCALE = 1\n")
    state = {**record(str(recorded)), "cfg": {"common": {"user_dir": str(recorded)}}}
    folder = installed(tmp_path, monkeypatch, name, "LOSS_SCALE = 1\n")
    assert for_checkpoint(None, state, "ck.pt") is None  # the same code: nothing said
    assert "warning" not in caplog.text
    (folder / "__init__.py").write_text("LOSS_SCALE = 3\n")
    assert for_checkpoint(None, state, "ck.pt") is None  # still provided by the installed package
    assert f"warning: the installed plugin {name!r} ({folder}) is not the code checkpoint ck.pt was saved with: " \
           "its .py files differ from the ones recorded" in caplog.text, caplog.text


@pytest.mark.slow
def test_resuming_with_edited_plugin_code_warns(trained, tmp_path, caplog):
    data = trained[0]
    folder, name = marking_plugin(tmp_path / "plugins")
    argv = [data, *tiny_model_flags(), "--cpu", "--save-dir", str(tmp_path / "ck"), "--log-format", "none",
            "--user-dir", str(folder)]
    train.main(argv + ["--max-update", "1"])
    train.main(argv + ["--max-update", "2"])  # resumed with the same code: nothing said
    assert "warning: the plugin folder" not in caplog.text
    with open(folder / "__init__.py", "a") as f:
        f.write("CHANGED = True\n")
    train.main(argv + ["--max-update", "3"])
    checkpoint = str(tmp_path / "ck" / "checkpoint_last.pt")
    assert WARNED.format(folder=folder, checkpoint=checkpoint) in caplog.text, caplog.text
