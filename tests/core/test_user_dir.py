"""--user-dir: a plugin's task, model and architecture train from the command line."""
import os
import subprocess
import sys

import pytest

from shardtrain.cli import preprocess, train
from shardtrain.config.run_config import build_train_parser
from shardtrain.core.errors import ConfigError
from st_testutils import MarkovChain, cli_refusal, json_records, write_markov_corpus

PLUGIN = os.path.join(os.path.dirname(__file__), "toy_plugin")


@pytest.mark.slow
@pytest.mark.flag_effect("--user-dir", "--task", "--arch", "--log-format", "--log-interval", "--log-file")
def test_plugin_components_and_flags_work_on_the_command_line(tmp_path):
    paths = write_markov_corpus(str(tmp_path / "text"), MarkovChain(n=8, seed=2), 5000, 500, line_len=40)
    data = str(tmp_path / "data-bin")
    preprocess.main(["--tokenizer", "space", "--trainpref", paths["train"], "--validpref", paths["valid"],
                     "--destdir", data, "--no-progress-bar"])
    log = str(tmp_path / "log")
    train.main([data, "--user-dir", PLUGIN, "--task", "toy_lm", "--toy-greeting", "bonjour",
                "--arch", "toy_bigram_wide", "--toy-layers", "3", "--tokens-per-sample", "16", "--batch-size", "8",
                "--max-update", "6", "--save-dir", str(tmp_path / "ck"), "--log-format", "json",
                "--log-interval", "1", "--log-file", log])
    built = sys.modules["toy_plugin"].BUILT
    assert built == {"greeting": "bonjour", "dim": 48, "layers": 3}  # preset dim, overridden layers
    losses = [r["loss"] for r in json_records(log, "train_inner")]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert os.path.exists(tmp_path / "ck" / "checkpoint_last.pt")


def test_plugin_flags_show_in_help():
    parser, _ = build_train_parser(["--user-dir", PLUGIN, "--task", "toy_lm", "--arch", "toy_bigram"])
    text = parser.format_help()
    assert "--toy-greeting" in text and "--toy-dim" in text


def test_missing_or_broken_user_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        build_train_parser(["--user-dir", str(tmp_path / "nope")])
    broken = tmp_path / "broken_plugin_xyz"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="failed to import: RuntimeError: boom"):
        build_train_parser(["--user-dir", str(broken)])


@pytest.mark.slow
def test_architecture_preset_with_a_wrong_key_is_named(tmp_path):
    plugin = tmp_path / "typo_preset_plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(
        "from shardtrain.models import register_model_architecture\n"
        "@register_model_architecture('transformer_lm', 'transformer_lm_typo_preset')\n"
        "def typo():\n    return {'decoder_layerz': 3}\n")
    # In a subprocess: the plugin's architecture must not stay registered in this test process.
    expected = ("error: The architecture 'transformer_lm_typo_preset' sets decoder_layerz, which "
                "TransformerLanguageModelConfig")
    for cli, args in (("train", [str(tmp_path), "--arch", "transformer_lm_typo_preset"]),
                      ("hydra_train", ["model=transformer_lm_typo_preset", f"task.data={tmp_path}", "--cfg", "job"])):
        result = subprocess.run([sys.executable, "-m", f"shardtrain.cli.{cli}", "--user-dir", str(plugin), *args],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr, \
            result.stderr[-2000:]


def test_a_user_dir_named_like_an_imported_module_is_refused(tmp_path):
    clash = tmp_path / "json"  # json is imported already: `import json` would answer with it, not the plugin
    clash.mkdir()
    (clash / "__init__.py").write_text("raise RuntimeError('the plugin was imported')\n")
    with pytest.raises(ConfigError, match=f"--user-dir {clash}: a module named 'json' is already imported from "
                                          "elsewhere. Rename the plugin folder"):
        build_train_parser(["--user-dir", str(clash)])


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_user_dir_holding_a_fifo_or_a_device_is_refused_in_one_paragraph(tmp_path, capsys, kind):
    plugin = tmp_path / f"irregular_{kind}_plugin"
    plugin.mkdir()
    (plugin / "__init__.py").write_text("")
    notes = plugin / "notes.py"
    os.mkfifo(notes) if kind == "fifo" else notes.symlink_to("/dev/zero")
    said = {"fifo": "a FIFO (named pipe)", "device": "a character device"}[kind]
    _, err = cli_refusal(train.main, [str(tmp_path / "data"), "--user-dir", str(plugin)], capsys)
    assert f"--user-dir {plugin}: {notes} is {said}, not a regular file." in err, err
    assert f"Remove it (rm {notes}) or replace it with a regular file" in err, err
    assert "irregular_" not in " ".join(sys.modules)  # refused before the import
