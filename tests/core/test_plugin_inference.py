"""A --user-dir model with only the required methods (gru_plugin: build_model and forward) trains, and
every command that loads its checkpoint runs it from another working directory when --user-dir names the
plugin, before and after the folder moved; without --user-dir the recorded folder is never imported: the
command refuses, naming it (test_plugin_trust.py has the refusal of each command, in-process)."""
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import shardtrain
from shardtrain.cli import consolidate

from st_testutils import make_space_data_bin

TESTS_ROOM = "shardtrain.core"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

GRU_PLUGIN = os.path.join(os.path.dirname(__file__), "gru_plugin")
# Each command in one process (a plugin registers once per process); the results as one JSON line.
COMMANDS = r"""
import io, json, sys
from shardtrain.cli import eval_lm, generate, interactive, validate
data, ck, long_prompt, *extra = sys.argv[1:]
out = {"validate": validate.main([data, "--path", ck, "--log-format", "none", *extra])["valid"]}
out["eval_lm"] = eval_lm.main([data, "--path", ck, "--gen-subset", "valid", "--tokens-per-sample", "64", *extra])
out["generate"] = generate.main([data, "--path", ck, "--prompt", long_prompt, "--beam", "2", "--max-len", "5",
                                 *extra])
sys.stdin = io.StringIO("w1 w2\nw3\n")
out["interactive"] = interactive.main([data, "--path", ck, "--sampling", "--max-len", "5", *extra])
out["plugin_file"] = sys.modules["gru_lm_plugin"].__file__
print("RESULT " + json.dumps(out, default=float))
"""


def _run(args, cwd, timeout=240):
    # the working directory is not the repository's: shardtrain is found through PYTHONPATH
    root = os.path.dirname(os.path.dirname(shardtrain.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _commands(cwd, data, checkpoint, *extra):
    result = _run(["-c", COMMANDS, data, checkpoint, " ".join(["w1"] * 20), *extra], cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


def _check_results(out, plugin_dir):
    assert os.path.dirname(out["plugin_file"]) == plugin_dir
    assert math.isfinite(out["validate"]["loss"]) and out["validate"]["loss"] > 0
    # no max_positions: unbounded, so blocks of 64 (trained on 16) and a prompt of 20 tokens are taken
    assert out["eval_lm"]["tokens"] > 0 and math.isfinite(out["eval_lm"]["perplexity"])
    assert len(out["generate"]) == 1 and out["generate"][0].startswith(" ".join(["w1"] * 20))
    assert len(out["interactive"]) == 2  # both lines answered
    texts = out["generate"] + [t for answer in out["interactive"] for t in answer]
    assert not any("<pad>" in t for t in texts)  # the dictionary's padding symbol is never generated


@pytest.mark.flag_effect("--user-dir")
def test_plugin_checkpoint_loads_from_anywhere_and_after_the_plugin_moved(tmp_path):
    home, elsewhere, moved = tmp_path / "home", tmp_path / "elsewhere", tmp_path / "moved"
    for d in (home, elsewhere, moved):
        d.mkdir()
    shutil.copytree(GRU_PLUGIN, home / "gru_lm_plugin")  # a copy of its own, so the test can move it
    data = make_space_data_bin(str(tmp_path / "data"), n_words=6, train_tokens=2000, valid_tokens=300, line_len=20)
    train = _run(["-m", "shardtrain.cli.train", data, "--user-dir", "gru_lm_plugin", "--arch", "gru_lm",
                  "--gru-dim", "16", "--tokens-per-sample", "16", "--batch-size", "8", "--max-update", "3",
                  "--save-dir", "ck", "--log-format", "json", "--log-interval", "1", "--threads", "1"], cwd=home)
    assert train.returncode == 0, train.stderr[-3000:]
    assert "GRULM has no flops_per_token(seq_len): tflops and mfu count 6 x its parameters" in train.stdout + train.stderr
    checkpoint = str(home / "ck" / "checkpoint_last.pt")
    state = torch.load(checkpoint, weights_only=True, map_location="cpu")
    plugin_dir = str(home / "gru_lm_plugin")
    recorded = dict(state["plugin"])
    assert re.fullmatch("[0-9a-f]{64}", recorded.pop("sha256"))  # of its .py files (test_plugin_trust.py pins one)
    assert recorded == {"user_dir": plugin_dir, "module": "gru_lm_plugin"}
    assert state["cfg"]["common"]["user_dir"] == plugin_dir  # given as a relative path, kept absolute

    # the recorded folder exists, and is still not imported unless named
    refused = _run(["-m", "shardtrain.cli.validate", data, "--path", checkpoint], cwd=elsewhere)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert (f"was trained with the plugin 'gru_lm_plugin' from the folder {plugin_dir}, and a plugin is imported "
            "only when you name it") in refused.stderr and f"--user-dir {plugin_dir}" in refused.stderr
    _check_results(_commands(elsewhere, data, checkpoint, "--user-dir", plugin_dir), plugin_dir)

    shutil.move(plugin_dir, moved / "gru_lm_plugin")
    # reading tensors and the config as data, conversion never imports the plugin
    sharded = str(elsewhere / "sharded")
    converted = _run(["-m", "shardtrain.cli.consolidate", checkpoint, sharded], cwd=elsewhere)
    assert converted.returncode == 0, converted.stderr[-3000:]

    # A decoy where the checkpoint says the plugin is: the folder --user-dir names is the one imported.
    os.mkdir(plugin_dir)
    with open(os.path.join(plugin_dir, "__init__.py"), "w") as f:
        f.write("raise RuntimeError('the recorded folder was imported')\n")
    out = _commands(elsewhere, data, sharded, "--user-dir", str(moved / "gru_lm_plugin"))
    _check_results(out, str(moved / "gru_lm_plugin"))
    model_only = str(elsewhere / "model.pt")  # the record survives both conversions
    consolidate.main([sharded, model_only, "--model-only"])
    assert torch.load(model_only, weights_only=True)["plugin"] == state["plugin"]
