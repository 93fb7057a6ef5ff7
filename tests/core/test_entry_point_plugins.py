"""Installed plugins: packages that declare a ``shardtrain.plugins`` entry point.

Each test "installs" a package the way pip leaves it on disk (the package next
to a ``*.dist-info`` directory with ``METADATA`` and ``entry_points.txt``) in a
temporary directory, then puts that directory on the path: in-process for the
loader's decisions, through ``PYTHONPATH`` for the real commands.
"""
import importlib.metadata
import os
import shutil
import subprocess
import sys

import pytest

from shardtrain.core.errors import ConfigError
from shardtrain.core.plugins import GROUP, load_entry_points
from st_testutils import json_records, last_checkpoint_state, make_space_data_bin

PLUGIN_SRC = os.path.join(os.path.dirname(__file__), "entry_point_plugin", "st_ep_plugin")
SUBPROCESS_TIMEOUT = 120


def install(site, dist_name, entry_points, modules=None, package_dir=None):
    """Lay out an installed distribution under ``site``; -> ``site``.

    ``entry_points``: {name: "module" or "module:callable"}; ``modules``:
    {file name: source} written at top level; ``package_dir`` is copied in."""
    os.makedirs(site, exist_ok=True)
    for name, source in (modules or {}).items():
        with open(os.path.join(site, name), "w") as f:
            f.write(source)
    if package_dir:
        shutil.copytree(package_dir, os.path.join(site, os.path.basename(package_dir)))
    info = os.path.join(site, f"{dist_name.replace('-', '_')}-0.1.0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(f"[{GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    return str(site)


def installed_entry_points(site, monkeypatch):
    """The group's entry points found on ``site`` only (with their distribution)."""
    monkeypatch.syspath_prepend(site)
    return [ep for dist in importlib.metadata.distributions(path=[site])
            for ep in dist.entry_points if ep.group == GROUP]


@pytest.fixture
def forget_modules():
    """Unimport the fixture modules a test imported, so the next test imports them afresh."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("st_loader_"):
            del sys.modules[name]


def run_python(args, site):
    """``python ARGS`` with the plugin installed (``site`` on PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT)


# -- the loader's decisions, in-process (fixture modules with no registry side effects) --

def test_module_entry_points_are_imported_and_callables_called_once(tmp_path, monkeypatch, forget_modules):
    site = install(tmp_path / "site", "st-loader-ok", {"b_mod": "st_loader_mod", "a_fn": "st_loader_fn:register"},
                   modules={"st_loader_mod.py": "IMPORTED = True\n",
                            "st_loader_fn.py": "CALLS = []\ndef register():\n    CALLS.append(len(CALLS))\n"})
    eps = installed_entry_points(site, monkeypatch)
    assert load_entry_points(eps) == ["a_fn", "b_mod"]  # name order, whatever the file order
    assert sys.modules["st_loader_mod"].IMPORTED is True
    assert sys.modules["st_loader_fn"].CALLS == [0]


@pytest.mark.parametrize("source, value, reason", [
    ("raise RuntimeError('boom, line one\\nline two')\n", "st_loader_bad",
     "RuntimeError: boom, line one line two"),
    ("import st_loader_no_such_dependency\n", "st_loader_bad",
     "ModuleNotFoundError: No module named 'st_loader_no_such_dependency'"),
    ("X = 3\n", "st_loader_bad:X", "TypeError: st_loader_bad:X is 3, not a module or a callable"),
    ("def register():\n    raise ValueError('bad registration')\n", "st_loader_bad:register",
     "ValueError: bad registration"),
    ("", "st_loader_bad:missing", "AttributeError"),
])
def test_a_failing_plugin_is_named_with_its_distribution_and_error(tmp_path, monkeypatch, forget_modules,
                                                                   source, value, reason):
    site = install(tmp_path / "site", "st-loader-bad", {"badplug": value}, modules={"st_loader_bad.py": source})
    with pytest.raises(ConfigError) as info:
        load_entry_points(installed_entry_points(site, monkeypatch))
    message = str(info.value)
    assert "Plugin 'badplug'" in message and "distribution st-loader-bad 0.1.0" in message
    assert reason in message and "\n" not in message
    assert "pip uninstall st-loader-bad" in message and "python -c 'import st_loader_bad'" in message


@pytest.mark.slow
def test_importing_shardtrain_loads_no_plugin_and_a_broken_one_stops_the_cli(tmp_path):
    """Import time loads nothing; the command loads it and exits 2 with one paragraph."""
    site = install(tmp_path / "site", "st-broken-plugin", {"broken_one": "st_broken_plugin"},
                   modules={"st_broken_plugin.py": "raise RuntimeError('boom from the broken plugin')\n"})
    # What the shard-train console script does, after importing every command first.
    script = ("import sys\n"
              "import shardtrain.cli.train, shardtrain.cli.validate, shardtrain.cli.generate, shardtrain.core.plugins\n"
              "assert 'st_broken_plugin' not in sys.modules, 'a plugin was imported at import time'\n"
              "sys.argv = ['shard-train', '--help']\n"
              "sys.exit(shardtrain.cli.train.main())\n")
    result = run_python(["-c", script], site)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "usage:" not in result.stdout
    assert result.stderr.startswith("shard-train: error: Plugin 'broken_one'")
    assert "distribution st-broken-plugin 0.1.0" in result.stderr
    assert "RuntimeError: boom from the broken plugin" in result.stderr


# -- the real commands with an installed plugin --

@pytest.mark.slow
def test_installed_plugin_architecture_and_optimizer_train_and_validate(tmp_path):
    site = install(tmp_path / "site", "st-ep-plugin",
                   {"tiny_archs": "st_ep_plugin.archs", "sgd": "st_ep_plugin.optim:register"},
                   package_dir=PLUGIN_SRC)
    data = make_space_data_bin(str(tmp_path), n_words=8, train_tokens=2000, valid_tokens=200, line_len=40)
    save, log = tmp_path / "ck", str(tmp_path / "train.log")
    result = run_python([
        "-m", "shardtrain.cli.train", data, "--arch", "ep_tiny_lm", "--optimizer", "ep_sgd", "--ep-momentum", "0.5",
        "--lr", "0.05", "--lr-scheduler", "fixed", "--tokens-per-sample", "16", "--batch-size", "4",
        "--max-update", "2", "--save-dir", str(save), "--log-format", "json", "--log-interval", "1",
        "--log-file", log, "--threads", "1", "--cpu", "--disable-validation"], site)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(json_records(log, "train_inner")) == 2

    state = last_checkpoint_state(save)
    cfg = state["cfg"]
    assert (cfg["components"]["arch"], cfg["components"]["optimizer"]) == ("ep_tiny_lm", "ep_sgd")
    assert (cfg["model"]["decoder_embed_dim"], cfg["model"]["decoder_layers"]) == (24, 1)  # the plugin's preset
    groups = state["optimizer"]["param_groups"]
    assert groups[0]["momentum"] == 0.5 and "betas" not in groups[0]  # torch.optim.SGD, not the default adam
    assert any("momentum_buffer" in s for s in state["optimizer"]["state"].values())

    # shard-validate rebuilds the model from the checkpoint's config: the plugin's arch must be known there too.
    result = run_python(["-m", "shardtrain.cli.validate", data, "--path", str(save / "checkpoint_last.pt"),
                         "--cpu", "--log-format", "simple"], site)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "valid on 'valid' subset" in result.stderr + result.stdout

