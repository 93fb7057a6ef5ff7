"""``shard-consolidate CHECKPOINT --to-hf OUTDIR`` (in-process, one file as input; the sharded input of a 2-rank
run is in test_hf_ranks.py): transformers' AutoModelForCausalLM loads the folder with no missing, unexpected or
mismatched keys and gives our logits within 1e-5; every file opens in safetensors.safe_open with
{"format": "pt"}; an index when split; the tokenizer files of the folder the run started from; HF -> shardtrain ->
HF bit-identical tensor by tensor; written whole or not at all; the refusals exit 2 and write nothing."""
import json
import os

import pytest
import torch
import transformers

from shardtrain.cli import consolidate
from shardtrain.config.run_config import parse_train_args, to_dict
from shardtrain.trainer.checkpoint.consolidate import write_file
from hf_models import (data_bin, imported, prompt, safetensors_files, save_tiny, tensors_of,  # noqa: F401
                        vocab)
from st_testutils import cli_refusal

TOKENIZER = b'{"version": "1.0", "model": {"type": "WordLevel"}}'


def checkpoint_from(data_bin, tmp_path, kind, **save):
    """A folder saved by transformers (with a tokenizer.json), imported, written as a single-file checkpoint."""
    folder = str(tmp_path / f"{kind}_in")
    save_tiny(kind, folder, vocab(data_bin), **save)
    with open(os.path.join(folder, "tokenizer.json"), "wb") as f:
        f.write(TOKENIZER)
    cfg, model = imported(data_bin, folder)
    path = str(tmp_path / f"{kind}.pt")
    write_file({"cfg": to_dict(cfg), "model": model.state_dict()}, path)
    return folder, model, path


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_transformers_loads_the_export_with_our_logits_and_the_same_tensors(data_bin, tmp_path, kind):
    folder, model, path = checkpoint_from(data_bin, tmp_path, kind)
    out = str(tmp_path / "out")
    consolidate.main([path, "--to-hf", out, "--max-shard-size", "8KB"])
    files = safetensors_files(out)
    assert len(files) >= 3 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        index = json.load(f)
    exported = tensors_of(out)
    assert sorted(index["weight_map"]) == sorted(exported)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in exported.values())
    original = tensors_of(folder)
    assert sorted(exported) == sorted(original)  # HF -> shardtrain -> HF: bit-identical, tensor by tensor
    for key, tensor in original.items():
        assert exported[key].dtype == tensor.dtype and torch.equal(exported[key], tensor), key
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True,
                                                                 attn_implementation="eager")
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert type(hf).__name__ == {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[kind]
    with torch.no_grad():
        assert (hf.eval()(prompt(vocab(data_bin))).logits - model(prompt(vocab(data_bin)))).abs().max() <= 1e-5
    with open(os.path.join(out, "tokenizer.json"), "rb") as f:
        assert f.read() == TOKENIZER  # the run knows its tokenizer: the folder it was fine-tuned from
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(folder, "config.json")) as f:
        source = json.load(f)
    for key in ("bos_token_id", "eos_token_id", "hidden_size", "num_key_value_heads", "rope_parameters",
                "tie_word_embeddings", "vocab_size", "model_type"):
        assert config[key] == source[key], key


def test_one_file_without_an_index_under_the_default_5gb(data_bin, tmp_path):
    _, _, path = checkpoint_from(data_bin, tmp_path, "qwen3")
    out = str(tmp_path / "out")
    os.mkdir(out)  # an empty directory may be the output
    consolidate.main([path, "--to-hf", out])
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors",
                                       "tokenizer.json"]
    assert tensors_of(out)  # format metadata checked inside


def test_written_whole_or_not_at_all(data_bin, tmp_path, monkeypatch):
    _, _, path = checkpoint_from(data_bin, tmp_path, "llama")
    import safetensors.torch
    calls, real, out = [], safetensors.torch.save_file, str(tmp_path / "out")

    def fails_on_the_third(*args, **kwargs):
        calls.append(os.path.exists(out))  # a crash now (SIGKILL, power) must leave no OUTDIR either
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", fails_on_the_third)
    with pytest.raises(OSError):
        consolidate.main([path, "--to-hf", out, "--max-shard-size", "8KB"])
    assert calls == [False, False, False]
    assert sorted(os.listdir(tmp_path)) == sorted(["llama_in", "llama.pt"])  # no OUTDIR, no partial sibling


def test_refusals_exit_2_and_write_nothing(data_bin, tmp_path, capsys):
    _, _, path = checkpoint_from(data_bin, tmp_path, "qwen3")
    capsys.readouterr()  # transformers' progress bar while saving the folder
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    _, err = cli_refusal(consolidate.main, [path, "--to-hf", str(taken)], capsys)
    assert "exists and is not an empty directory" in err and os.listdir(taken) == ["notes.txt"]
    _, err = cli_refusal(consolidate.main, [path, "--to-hf", str(tmp_path / "o"), "--max-shard-size", "5 parsecs"],
                         capsys)
    assert "--max-shard-size '5 parsecs' is not a size" in err
    lm = parse_train_args([data_bin, "--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "8",
                           "--decoder-ffn-embed-dim", "8", "--decoder-attention-heads", "2"])
    write_file({"cfg": to_dict(lm), "model": {"x": torch.zeros(1)}}, str(tmp_path / "lm.pt"))
    _, err = cli_refusal(consolidate.main, [str(tmp_path / "lm.pt"), "--to-hf", str(tmp_path / "o")], capsys)
    assert "transformer_lm model (--arch transformer_lm), which --to-hf does not export" in err
    assert "llama" in err
    assert not os.path.exists(tmp_path / "o") and not [n for n in os.listdir(tmp_path) if n.startswith(".")]
