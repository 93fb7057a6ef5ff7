"""shard-preprocess --hf-tokenizer's user mistakes (issue 47 §5): a folder with no tokenizer, and flags that
--hf-tokenizer makes meaningless, are one paragraph, exit 2, and nothing is written."""
import os

import pytest

from hf_folders import make_folder
from shardtrain.cli import preprocess
from st_testutils import cli_refusal


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("the cat sat\n")
    return str(path)


def test_a_folder_without_a_tokenizer_is_refused_and_nothing_is_written(tmp_path, text, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "vocab_size": 10}')
    dest = tmp_path / "out" / "bin"
    _, err = cli_refusal(preprocess.main, ["--trainpref", text, "--destdir", str(dest), "--hf-tokenizer",
                                           str(folder)], capsys)
    assert f"--hf-tokenizer {folder}: no tokenizer.json there" in err and "Nothing was written" in err
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("flags, named", [
    (["--srcdict", "TEXT"], "--srcdict cannot apply; drop it"),
    (["--tokenizer", "space", "--padding-factor", "1"], "--tokenizer space, --padding-factor cannot apply; drop them"),
    (["--nwordssrc", "5", "--thresholdsrc", "2", "--spm-vocab-size", "9"],
     "--spm-vocab-size, --thresholdsrc, --nwordssrc cannot apply"),
])
def test_vocabulary_flags_beside_hf_tokenizer_are_refused(tmp_path, text, capsys, flags, named):
    folder = make_folder(tmp_path / "llama", "llama")
    flags = [text if f == "TEXT" else f for f in flags]
    _, err = cli_refusal(preprocess.main, ["--trainpref", text, "--destdir", str(tmp_path / "bin"),
                                           "--hf-tokenizer", folder, *flags], capsys)
    assert "--hf-tokenizer gives the vocabulary and the tokenization" in err and named in err
    assert not os.path.exists(tmp_path / "bin")


def test_hf_tokenizer_needs_no_trainpref(tmp_path, text):
    folder = make_folder(tmp_path / "qwen", "qwen")
    preprocess.main(["--validpref", text, "--destdir", str(tmp_path / "bin"), "--hf-tokenizer", folder])
    assert sorted(os.listdir(tmp_path / "bin")) == ["dict.txt", "manifest.json", "preprocess.json", "tokenizer.json",
                                                    "tokenizer_config.json", "valid.bin", "valid.idx"]
