"""A data-bin in a Hugging Face folder's token ids and a model imported from that folder train together with
nothing else to pass, and their export carries the tokenizer on (issue 47 §2, §3); a data-bin whose ids are not
the folder's tokens is refused through shard-train's own main before anything is written. All in-process, one
process: shard-preprocess, shard-train and shard-consolidate as a user runs them, in that order.

- fine-tuned from a folder with its tokenizer: the export holds that folder's tokenizer files, byte for byte;
- trained from scratch (``--arch llama``) on an HF data-bin: the export holds the data-bin's copies, and its
  config.json the token ids the data-bin's lines were made with (written down here from the tokenizer: the
  folder's ``<|begin_of_text|>`` and ``<|end_of_text|>``, and the first row past the tokenizer as pad);
- refused, exit 2, no save dir: a data-bin made with another tokenizer.json of the same size, and one not made
  from a Hugging Face tokenizer at all, each beside a folder that has a tokenizer; a data-bin of another size
  is named for its vocabulary, before the weights' shapes;
- a folder with no tokenizer.json and a data-bin of its size: accepted, with a warning that says what could not
  be checked."""
import json
import logging
import os
import shutil

import pytest
from tokenizers import Tokenizer

from hf_folders import TEXT, make_folder
from hf_models import save_tiny
from shardtrain.cli import consolidate, preprocess, train
from st_testutils import cli_refusal

TESTS_ROOM = "shardtrain.trainer.preflight"  # the refusals are the launcher's; the exports hf_export's
RUN = ["--tokens-per-sample", "16", "--cpu", "--max-update", "2", "--batch-size", "2", "--lr", "0.001", "--lr-scheduler", "fixed",
       "--no-epoch-checkpoints", "--disable-validation", "--log-format", "none"]


def _folder(tmp_path, name="folder", extra=0):
    """The tokenizer folder of hf_folders' ``qwen`` kind, then a tiny Qwen3 saved into it by transformers (its
    config.json replaced by transformers', with the tokenizer's ids: eos 300, vocabulary 8 rows past it)."""
    folder = make_folder(tmp_path / name, "qwen")
    eos = Tokenizer.from_file(os.path.join(folder, "tokenizer.json")).token_to_id("<|endoftext|>")
    with open(os.path.join(folder, "config.json")) as f:
        size = json.load(f)["vocab_size"]
    save_tiny("qwen3", folder, size + extra, bos_token_id=eos, eos_token_id=eos)
    return folder, size, eos


def _data_bin(tmp_path, folder, name="data-bin"):
    text = tmp_path / "train.txt"
    text.write_text("\n".join(TEXT * 6) + "\n")
    dest = str(tmp_path / name)
    preprocess.main(["--hf-tokenizer", folder, "--trainpref", str(text), "--destdir", dest, "--no-progress-bar"])
    return dest


def _plain_data_bin(tmp_path, symbols: int) -> str:
    """A fairseq data-bin (no Hugging Face tokenizer) of exactly ``symbols`` ids: fairseq's 4 specials, then a
    --srcdict of its own words."""
    words = [f"w{i}" for i in range(symbols - 4)]
    (tmp_path / "dict.txt").write_text("".join(f"{w} 1\n" for w in words))
    (tmp_path / "plain.txt").write_text("\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(12))
                                                 for i in range(30)) + "\n")
    dest = str(tmp_path / "plain")
    preprocess.main(["--tokenizer", "space", "--srcdict", str(tmp_path / "dict.txt"), "--trainpref",
                     str(tmp_path / "plain.txt"), "--destdir", dest, "--no-progress-bar"])
    return dest


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _export(tmp_path, save, tokenizer_from) -> dict:
    """shard-consolidate the run's checkpoint_last --to-hf; checks its tokenizer files are ``tokenizer_from``'s,
    byte for byte, and returns its config.json."""
    out = str(tmp_path / "out")
    consolidate.main([str(save / "checkpoint_last.pt"), "--to-hf", out])
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert _read(os.path.join(out, name)) == _read(os.path.join(tokenizer_from, name)), name
    with open(os.path.join(out, "config.json")) as f:
        return json.load(f)


@pytest.mark.slow  # a training run
def test_a_fine_tune_from_the_folder_trains_on_its_data_bin_and_exports_its_tokenizer(tmp_path, capsys):
    folder, size, eos = _folder(tmp_path)
    data = _data_bin(tmp_path, folder)
    save = tmp_path / "run"
    train.main([data, "--finetune-from-model", folder, "--save-dir", str(save), *RUN])  # nothing else to pass
    config = _export(tmp_path, save, folder)
    assert (config["vocab_size"], config["eos_token_id"], config["bos_token_id"]) == (size, eos, eos)


@pytest.mark.slow  # a training run
def test_a_run_from_scratch_on_an_hf_data_bin_exports_the_data_bins_tokenizer_and_ids(tmp_path):
    folder = make_folder(tmp_path / "tok", "llama")
    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    bos, eos = tokenizer.token_to_id("<|begin_of_text|>"), tokenizer.token_to_id("<|end_of_text|>")
    reserved = tokenizer.token_to_id("<|reserved_1|>")  # the pad rule: the largest special that is not bos or eos
    data = _data_bin(tmp_path, folder)
    shutil.rmtree(folder)  # the export reads the data-bin's copies, not the folder the data-bin was made from
    save = tmp_path / "run"
    train.main([data, "--arch", "llama", "--decoder-layers", "1", "--decoder-embed-dim", "16",
                "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--decoder-kv-heads", "1",
                "--save-dir", str(save), *RUN])
    config = _export(tmp_path, save, data)
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (bos, eos, reserved)
    assert config["vocab_size"] == tokenizer.get_vocab_size()


def _other_tokenizer(tmp_path, folder):
    """The same folder with a tokenizer.json that is another file (the vocabulary size unchanged)."""
    other = str(tmp_path / "other")
    shutil.copytree(folder, other)
    path = os.path.join(other, "tokenizer.json")
    with open(path) as f:
        tokenizer = json.load(f)
    vocab = tokenizer["model"]["vocab"]
    a, b = sorted(vocab)[-2:]  # two tokens swap ids: the same size, other tokens behind the ids
    vocab[a], vocab[b] = vocab[b], vocab[a]
    with open(path, "w") as f:
        json.dump(tokenizer, f)
    return other


@pytest.mark.parametrize("case", ["another tokenizer", "not from a tokenizer", "another size"])
def test_a_data_bin_whose_ids_are_not_the_folders_tokens_is_refused_before_anything_is_written(tmp_path, capsys,
                                                                                             case):
    folder, size, _ = _folder(tmp_path)
    if case == "another tokenizer":
        data, words = _data_bin(tmp_path, _other_tokenizer(tmp_path, folder)), \
            "was made with another tokenizer.json than the model folder's"
    elif case == "not from a tokenizer":
        data, words = _plain_data_bin(tmp_path, size), "was not made from a Hugging Face tokenizer"
    else:
        data, words = _plain_data_bin(tmp_path, 12), f"The data-bin's vocabulary has 12 ids, the model's embedding " \
            f"{size} rows"
    capsys.readouterr()
    save = tmp_path / "save"
    _, err = cli_refusal(train.main, [data, "--finetune-from-model", folder, "--save-dir", str(save), *RUN], capsys)
    assert words in err and "shard-preprocess --hf-tokenizer" in err
    assert not save.exists()


@pytest.mark.slow  # a training run
def test_a_folder_without_a_tokenizer_is_accepted_with_a_warning(tmp_path, caplog):
    folder, size, _ = _folder(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        os.remove(os.path.join(folder, name))
    data = _plain_data_bin(tmp_path, size)
    with caplog.at_level(logging.WARNING):
        train.main([data, "--finetune-from-model", folder, "--save-dir", str(tmp_path / "run"), *RUN])
    assert any("holds no tokenizer.json, so whether the data-bin's ids are the model's tokens cannot be checked"
               in r.getMessage() for r in caplog.records)
    assert os.path.isfile(tmp_path / "run" / "checkpoint_last.pt")


def test_a_damaged_data_bin_header_is_named_and_the_export_has_no_tokenizer(tmp_path, caplog):
    from shardtrain.trainer.checkpoint.hf_export import _hf_data_bin
    data = tmp_path / "bin"
    data.mkdir()
    (data / "dict.txt").write_text('#shardtrain:hf-tokenizer {"format": 1, "size": "many"}\n')
    with caplog.at_level(logging.WARNING):
        assert _hf_data_bin(str(data)) is None
    assert any("--to-hf writes no tokenizer files" in r.getMessage() and "header is damaged" in r.getMessage()
               for r in caplog.records)
    (data / "dict.txt").write_text("the 3\n")  # a fairseq data-bin: no tokenizer, nothing said
    caplog.clear()
    assert _hf_data_bin(str(data)) is None and not caplog.records
