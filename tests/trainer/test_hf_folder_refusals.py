"""A Hugging Face folder that cannot be loaded is refused through shard-train's own main, in-process, before any
rank starts: one paragraph, exit 2, no save dir written. Each of issue 47's bad inputs: no config.json, an
unsupported model_type (naming the supported ones), a shard the index names but the folder lacks, a tensor whose
shape disagrees with the config, a truncated safetensors file; and a model flag contradicting config.json."""
import json
import os

import pytest

from shardtrain.cli import train
from hf_models import data_bin, rewrite_config, safetensors_files, save_tiny, vocab  # noqa: F401 (a fixture)
from st_testutils import cli_refusal

TESTS_ROOM = "shardtrain.trainer.preflight"  # it drives the command: its imports cannot say which room it tests


def _no_config(folder):
    os.remove(os.path.join(folder, "config.json"))


def _mistral(folder):
    rewrite_config(folder, model_type="mistral")


def _missing_shard(folder):
    os.remove(os.path.join(folder, safetensors_files(folder)[1]))


def _wrong_shape(folder):
    rewrite_config(folder, intermediate_size=48)  # the files hold 64-wide SwiGLU matrices


def _truncated(folder):
    path = os.path.join(folder, safetensors_files(folder)[0])
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 64)


CASES = {
    "no config.json": (_no_config, [], "holds safetensors weights but no config.json"),
    "unsupported model_type": (_mistral, [], "model_type 'mistral', which shardtrain does not load. Supported "
                                             "model_type values: llama, qwen3"),
    "missing shard": (_missing_shard, [], "which {folder} does not hold: the download is incomplete"),
    "shape disagrees": (_wrong_shape, [], "model.layers.0.mlp.gate_proj.weight has shape [64, 32] in the folder, "
                                          "but the model config.json and the data-bin's dictionary describe has "
                                          "[48, 32]"),
    "truncated file": (_truncated, [], "is not a readable safetensors file"),
    "flag contradicts": (lambda folder: None, ["--decoder-kv-heads", "4"],
                         "--decoder-kv-heads 4 (from the command line) but config.json's num_key_value_heads gives 2"),
    "vocabulary differs": (lambda folder: None, [],  # a 20-token folder, a 16-symbol data-bin
                           "The data-bin's vocabulary has 16 ids, the model's embedding 20 rows"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_folder_is_one_paragraph_exit_2_and_nothing_written(data_bin, tmp_path, capsys, case):
    damage, flags, words = CASES[case]
    folder = str(tmp_path / "folder")
    save_tiny("qwen3", folder, 20 if case == "vocabulary differs" else vocab(data_bin))
    damage(folder)
    capsys.readouterr()  # transformers' progress bar while saving
    save_dir = tmp_path / "save"
    _, err = cli_refusal(train.main, [data_bin, "--finetune-from-model", folder, "--tokens-per-sample", "16",
                                      "--cpu", "--max-update", "1", "--save-dir", str(save_dir), *flags], capsys)
    assert words.format(folder=folder) in err
    assert not save_dir.exists()


def test_the_index_naming_a_file_outside_the_folder_is_refused(data_bin, tmp_path, capsys):
    folder = str(tmp_path / "folder")
    save_tiny("llama", folder, vocab(data_bin))
    index_path = os.path.join(folder, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    first = next(iter(index["weight_map"]))
    index["weight_map"][first] = "../elsewhere.safetensors"
    with open(index_path, "w") as f:
        json.dump(index, f)
    capsys.readouterr()
    _, err = cli_refusal(train.main, [data_bin, "--finetune-from-model", folder, "--cpu", "--save-dir",
                                      str(tmp_path / "save")], capsys)
    assert "names files outside the folder" in err and not (tmp_path / "save").exists()
