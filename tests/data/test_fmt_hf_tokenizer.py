"""``shard-preprocess --hf-tokenizer DIR`` (issue 47 §2): the data-bin's ids are the tokenizer's own, every line is
the ``tokenizers`` package's encoding of it (its post-processor's specials) plus eos, and the dictionary maps id i
to the tokenizer's token i with bos/eos/pad/unk where the folder puts them (the rules: data/hf_folder.py). The
expected ids are computed here by ``tokenizers`` itself, the special ids written down by hand from how
tests/helpers/hf_folders.py builds each folder (the BPE trainer's 300 tokens, then the specials)."""
import json
import os
import re

import pytest
from tokenizers import Tokenizer

from hf_folders import TEXT, make_folder
from shardtrain.core.errors import DataError
from shardtrain.data.dictionary import Dictionary
from shardtrain.data.hf_folder import check_matches_model, read_hf_vocabulary
from shardtrain.data.indexed_dataset import MMapIndexedDataset
from shardtrain.data.manifest import check_at_start
from shardtrain.data.preprocess import PreprocessConfig, preprocess
from shardtrain.data.tokenizers import load_tokenizer

# An empty line, and one spelling out a special token (a real token of the text: kept, never pad).
LINES = TEXT + ["", "the cat <|reserved_0|> <|im_end|> sat"]
# kind: (size, bos, eos, pad, unk), by hand: llama's specials are 300-303 (bos, eos, reserved 0 and 1), pad the
# highest special that is neither (303), no unk; qwen's 300-302 (<|endoftext|> eos = pad = config's bos), pad the
# first of config.json's 8 extra rows (303); wordlevel's 0-3 (<pad>, <unk>, </s>, <s>) before its 26 words.
SPECIALS = {"llama": (304, 300, 301, 303, 303), "qwen": (311, 300, 300, 303, 303), "wordlevel": (30, 3, 2, 0, 1)}


def _data_bin(tmp_path, kind, **flags):
    folder = make_folder(tmp_path / kind, kind)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(LINES) + "\n")
    dest = tmp_path / f"bin-{kind}"
    preprocess(PreprocessConfig(trainpref=str(text), validpref=str(text), destdir=str(dest), hf_tokenizer=folder,
                                no_progress_bar=True, **flags))
    return folder, str(dest)


@pytest.mark.parametrize("kind", sorted(SPECIALS))
def test_the_ids_are_the_tokenizers_encoding_plus_eos(tmp_path, kind):
    folder, dest = _data_bin(tmp_path, kind)
    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    size, bos, eos, pad, unk = SPECIALS[kind]
    for split in ("train", "valid"):
        got = [list(map(int, item)) for item in MMapIndexedDataset(os.path.join(dest, split))]
        assert got == [tokenizer.encode(line).ids + [eos] for line in LINES]
    if kind == "llama":  # its post-processor prepends bos; the others add nothing
        assert got[0][0] == bos and got[len(TEXT)] == [bos, eos]
    else:
        assert got[len(TEXT)] == [eos]


@pytest.mark.parametrize("kind", sorted(SPECIALS))
def test_the_dictionary_is_the_tokenizers_vocabulary_at_its_own_ids(tmp_path, kind):
    folder, dest = _data_bin(tmp_path, kind)
    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    d = Dictionary.load(os.path.join(dest, "dict.txt"))
    assert (len(d), d.bos(), d.eos(), d.pad(), d.unk()) == SPECIALS[kind]
    n = tokenizer.get_vocab_size()
    assert [d[i] for i in range(n)] == [tokenizer.id_to_token(i) for i in range(n)]
    assert all(d.index(tokenizer.id_to_token(i)) == i for i in range(n))
    assert [d[i] for i in range(n, len(d))] == [f"<unused{i}>" for i in range(n, len(d))]  # qwen's 8 spare rows
    assert load_tokenizer(dest).encode("the cat") == tokenizer.encode("the cat", add_special_tokens=False).tokens
    assert check_at_start(dest).startswith("intact (")  # tokenizer.json is in the manifest


def test_a_fairseq_dict_txt_loads_as_before(fairseq_dir):
    d = Dictionary.load(str(fairseq_dir / "dict.txt"))
    assert d.hf_spec is None and (d.bos(), d.pad(), d.eos(), d.unk(), d.nspecial) == (0, 1, 2, 3, 4)
    assert d.symbols[:4] == ["<s>", "<pad>", "</s>", "<unk>"]


def test_the_dictionary_round_trips_through_save(tmp_path):
    _, dest = _data_bin(tmp_path, "qwen")
    d = Dictionary.load(os.path.join(dest, "dict.txt"))
    d.save(os.path.join(dest, "copy.txt"))
    assert open(os.path.join(dest, "copy.txt")).read() == open(os.path.join(dest, "dict.txt")).read()
    assert Dictionary.load(os.path.join(dest, "copy.txt")) == d


def test_a_replaced_tokenizer_json_is_refused_on_load(tmp_path):
    _, dest = _data_bin(tmp_path, "llama")
    other = make_folder(tmp_path / "other", "qwen")
    os.replace(os.path.join(other, "tokenizer.json"), os.path.join(dest, "tokenizer.json"))
    with pytest.raises(DataError, match="not the tokenizer this data-bin was made with"):
        Dictionary.load(os.path.join(dest, "dict.txt"))
    os.remove(os.path.join(dest, "tokenizer.json"))
    with pytest.raises(DataError, match="has no such file"):
        Dictionary.load(os.path.join(dest, "dict.txt"))


def _edit(folder, name, **changes):
    path = os.path.join(folder, name)
    with open(path) as f:
        value = json.load(f)
    value.update(changes)
    value = {k: v for k, v in value.items() if v != "DROP"}
    with open(path, "w") as f:
        json.dump(value, f)


def test_the_copied_tokenizer_json_is_in_the_manifest(tmp_path):
    """It decides what every id means: a data-bin whose manifest does not list it is refused, as for spm.model."""
    _, dest = _data_bin(tmp_path, "llama")
    with open(os.path.join(dest, "manifest.json")) as f:
        manifest = json.load(f)
    del manifest["files"]["tokenizer.json"]
    with open(os.path.join(dest, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    with pytest.raises(DataError, match="holds tokenizer.json, which its manifest.json does not list"):
        check_at_start(dest)


def test_folder_refusals_each_say_what_is_wrong(tmp_path):
    folder = make_folder(tmp_path / "llama", "llama")
    _edit(folder, "config.json", vocab_size=303)
    with pytest.raises(DataError, match="vocab_size 303, but its tokenizer has ids up to 303"):
        read_hf_vocabulary(folder)
    _edit(folder, "config.json", vocab_size=304, eos_token_id="DROP")
    _edit(folder, "tokenizer_config.json", eos_token="DROP")
    with pytest.raises(DataError, match="names an end-of-sequence token"):
        read_hf_vocabulary(folder)
    _edit(folder, "tokenizer_config.json", eos_token="<|nonesuch|>")
    with pytest.raises(DataError, match=re.escape("names the token '<|nonesuch|>', which its tokenizer.json")):
        read_hf_vocabulary(folder)
    word = make_folder(tmp_path / "word", "wordlevel")  # no config.json: no spare row
    _edit(word, "tokenizer_config.json", pad_token="</s>")  # pad = eos would drop every eos target: not taken
    assert read_hf_vocabulary(word)["pad"] == 0  # the one special that is not bos (3), eos (2) or unk (1): <pad>
    with open(os.path.join(word, "tokenizer.json")) as f:
        tokenizer_json = json.load(f)
    for token in tokenizer_json["added_tokens"]:
        token["special"] = token["content"] != "<pad>"
    with open(os.path.join(word, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json, f)
    with pytest.raises(DataError, match="no id can serve as padding"):
        read_hf_vocabulary(word)


def test_pad_never_shares_an_id_with_a_real_target(tmp_path):
    """Qwen's pad_token is its eos: taking it would make the loss skip every eos target. The first spare row is
    taken instead; and a text that spells out the pad token is refused rather than binarized."""
    spec = read_hf_vocabulary(make_folder(tmp_path / "qwen", "qwen"))
    assert spec["pad"] not in (spec["eos"], spec["bos"]) and spec["pad"] == 303
    folder = make_folder(tmp_path / "llama", "llama")
    text = tmp_path / "pad.txt"
    text.write_text("fine\nthe cat <|reserved_1|>\n")
    with pytest.raises(DataError, match=r"encodes to the pad id 303 \(the token '<\|reserved_1\|>'"):
        preprocess(PreprocessConfig(trainpref=str(text), destdir=str(tmp_path / "bin"), hf_tokenizer=folder,
                                    no_progress_bar=True))
    assert not os.path.exists(tmp_path / "bin")


def test_a_mismatched_vocabulary_is_refused(tmp_path):
    llama, dest = _data_bin(tmp_path, "llama")
    d = Dictionary.load(os.path.join(dest, "dict.txt"))
    check_matches_model(d, 304, llama)  # the folder it was made from: accepted
    with pytest.raises(DataError, match="vocabulary has 304 ids, the model's embedding 311 rows"):
        check_matches_model(d, 311)
    qwen = make_folder(tmp_path / "qwen", "qwen")
    with pytest.raises(DataError, match="made with another tokenizer.json"):
        check_matches_model(d, 304, qwen)
    fairseq = Dictionary()
    fairseq.pad_to_multiple_(304)
    with pytest.raises(DataError, match="not made from a Hugging Face tokenizer"):
        check_matches_model(fairseq, 304, llama)


def test_another_tokenizer_into_the_same_destdir_refuses_the_old_splits(tmp_path):
    _, dest = _data_bin(tmp_path, "llama")
    text = tmp_path / "more.txt"
    text.write_text("the dog\n")
    with pytest.raises(DataError, match="train.bin, train.idx from an earlier run"):
        preprocess(PreprocessConfig(validpref=str(text), destdir=dest, no_progress_bar=True,
                                    hf_tokenizer=make_folder(tmp_path / "qwen", "qwen")))
    preprocess(PreprocessConfig(testpref=str(text), destdir=dest, no_progress_bar=True,
                                hf_tokenizer=str(tmp_path / "llama")))  # the same tokenizer adds a split
    assert list(map(int, MMapIndexedDataset(os.path.join(dest, "test"))[0]))[-1] == 301
