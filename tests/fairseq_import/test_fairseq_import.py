"""shard-import-fairseq: a checkpoint fairseq 0.12.2 wrote scores what fairseq reported, and
older (pickled-object) checkpoints need --trust-checkpoint and go through an allow-list."""
import argparse
import copy
import io
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from shardtrain.fairseq_import.fairseq_lm import to_shardtrain
from shardtrain.models.transformer_lm.fairseq_checkpoint import convert_weights
from shardtrain.fairseq_import.fairseq_pickle import FairseqStandIn, RestrictedUnpickler
from shardtrain.cli import import_fairseq, train, validate
from shardtrain.config.run_config import from_dict
from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.resolved import Components, build_model, build_task

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
FAIRSEQ_CKPT = str(FIXTURES / "fairseq-0.12-transformer_lm.pt")
DATA_BIN = str(FIXTURES / "fairseq-0.12-data-bin")
FAIRSEQ_VALID_LOSS = 7.508  # what fairseq 0.12.2 reported at update 200 (base 2), see fixtures' README


@pytest.fixture(scope="module")
def fairseq_state():
    return torch.load(FAIRSEQ_CKPT, map_location="cpu", weights_only=True)


def valid_loss(path, data=DATA_BIN):
    return validate.main([data, "--path", str(path), "--cpu"])["valid"]["loss"]


def error_of(capsys, fn, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        fn(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_fairseq_012_checkpoint_scores_fairseqs_valid_loss(tmp_path, fairseq_state):
    out = tmp_path / "imported.pt"
    import_fairseq.main([FAIRSEQ_CKPT, str(out), "--data", DATA_BIN])
    state = torch.load(out, weights_only=True)  # our safe format
    model_cfg = state["cfg"]["model"]
    assert (model_cfg["decoder_layers"], model_cfg["decoder_embed_dim"], model_cfg["decoder_ffn_embed_dim"],
            model_cfg["decoder_attention_heads"]) == (2, 64, 128, 2)
    assert model_cfg["decoder_normalize_before"] is False and model_cfg["decoder_learned_pos"] is False
    assert state["cfg"]["task"]["tokens_per_sample"] == 64 and state["task_fingerprint"]
    # fused qkv is fairseq's q, k, v stacked in that order
    q, k, v = (fairseq_state["model"][f"decoder.layers.1.self_attn.{p}_proj.weight"] for p in "qkv")
    assert torch.equal(state["model"]["blocks.1.self_attn.qkv_proj.weight"], torch.cat([q, k, v]))
    assert abs(valid_loss(out) - FAIRSEQ_VALID_LOSS) < 0.01
    assert fairseq_state["extra_state"]["val_loss"] == FAIRSEQ_VALID_LOSS
    # the unconverted fairseq file is accepted directly too (converted in memory)
    assert valid_loss(FAIRSEQ_CKPT) == valid_loss(out)


@pytest.mark.slow
def test_finetune_from_fairseq_and_resume_refused(tmp_path, capsys):
    model = ["--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "128",
             "--decoder-attention-heads", "2", "--tokens-per-sample", "64", "--batch-size", "8", "--cpu",
             "--log-format", "none"]
    save = str(tmp_path / "ft")
    train.main([DATA_BIN, *model, "--max-update", "1", "--lr", "1e-12", "--save-dir", save,
                "--finetune-from-model", FAIRSEQ_CKPT, "--no-epoch-checkpoints"])
    tuned = torch.load(f"{save}/checkpoint_last.pt", weights_only=True)["model"]
    fairseq_fc1 = torch.load(FAIRSEQ_CKPT, weights_only=True)["model"]["decoder.layers.0.fc1.weight"]
    assert torch.allclose(tuned["blocks.0.fc1.weight"], fairseq_fc1, atol=1e-8)
    err = error_of(capsys, train.main, [DATA_BIN, *model, "--max-update", "1", "--save-dir", str(tmp_path / "r"),
                                        "--restore-file", FAIRSEQ_CKPT])
    assert "fairseq checkpoint" in err and "--finetune-from-model" in err and "shard-import-fairseq" in err


class _FakeMeter:
    """Stands for fairseq.meters.AverageMeter, which fairseq <= 0.8 pickled into extra_state."""

    def __init__(self):
        self.avg, self.count = 7.7, 3


def legacy_checkpoint(path, fairseq_state, monkeypatch):
    """A fairseq 0.9-style file: torch's legacy format, flat ``args`` namespace, fused in_proj and
    ``embed_out`` weight names, a fairseq object in extra_state."""
    flat = {k: v for section in ("common", "dataset", "task", "model") for k, v in fairseq_state["cfg"][section].items()
            if k not in ("_name", "batch_size", "batch_size_valid")}
    args = argparse.Namespace(**flat, arch="transformer_lm", task="language_modeling", max_sentences=8)
    model = {}
    for name, tensor in fairseq_state["model"].items():
        if ".self_attn.q_proj." in name:
            kind = name.rsplit(".", 1)[1]
            parts = [fairseq_state["model"][name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            model[name.replace("q_proj." + kind, "in_proj_" + kind)] = torch.cat(parts)
        elif ".self_attn.k_proj." not in name and ".self_attn.v_proj." not in name:
            model[name.replace("output_projection.weight", "embed_out")] = tensor
    meters = types.ModuleType("fairseq.meters")
    _FakeMeter.__module__, _FakeMeter.__qualname__ = "fairseq.meters", "AverageMeter"
    meters.AverageMeter = _FakeMeter
    monkeypatch.setitem(sys.modules, "fairseq", types.ModuleType("fairseq"))
    monkeypatch.setitem(sys.modules, "fairseq.meters", meters)
    state = {"args": args, "model": model, "optimizer_history": fairseq_state["optimizer_history"],
             "extra_state": {"train_meters": {"train_loss": _FakeMeter()}}}
    torch.save(state, path, _use_new_zipfile_serialization=False)
    monkeypatch.delitem(sys.modules, "fairseq.meters")
    monkeypatch.delitem(sys.modules, "fairseq")


def test_pickled_objects_need_trust_then_load_through_the_allow_list(tmp_path, fairseq_state, monkeypatch, capsys):
    old = str(tmp_path / "fairseq-0.9.pt")
    legacy_checkpoint(old, fairseq_state, monkeypatch)
    out = str(tmp_path / "out.pt")
    err = error_of(capsys, import_fairseq.main, [old, out, "--data", DATA_BIN])
    assert "--trust-checkpoint" in err and "argparse.Namespace" in err and "arbitrary code" in err
    assert not os.path.exists(out)
    err = error_of(capsys, validate.main, [DATA_BIN, "--path", old])  # refused, pointed to the converter
    assert "shard-import-fairseq" in err and "--trust-checkpoint" in err
    import_fairseq.main([old, out, "--data", DATA_BIN, "--trust-checkpoint"])
    assert abs(valid_loss(out) - FAIRSEQ_VALID_LOSS) < 0.01

    # fairseq 0.10/0.11: cfg as an omegaconf DictConfig (with an interpolation)
    cfg = OmegaConf.create(copy.deepcopy(fairseq_state["cfg"]))
    cfg.model.tokens_per_sample = "${task.tokens_per_sample}"
    dictconfig = str(tmp_path / "fairseq-0.10.pt")
    torch.save({**fairseq_state, "cfg": cfg}, dictconfig)
    import_fairseq.main([dictconfig, out, "--data", DATA_BIN, "--trust-checkpoint", "--overwrite"])
    assert torch.load(out, weights_only=True)["cfg"]["model"]["max_target_positions"] == 64


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.slow
def test_code_in_a_trusted_pickle_is_refused_and_garbage_is_reported(tmp_path, fairseq_state, capsys):
    marker = tmp_path / "pwned"
    evil = str(tmp_path / "evil.pt")
    torch.save({**fairseq_state, "args": argparse.Namespace(arch="transformer_lm"), "x": _Exploit(marker)}, evil)
    err = error_of(capsys, import_fairseq.main, [evil, str(tmp_path / "o.pt"), "--data", DATA_BIN,
                                                 "--trust-checkpoint"])
    assert "allow-list" in err and "system" in err
    assert not marker.exists()

    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(os.urandom(2048))
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    result = subprocess.run([sys.executable, "-m", "shardtrain.cli.import_fairseq", str(garbage),
                             str(tmp_path / "o.pt"), "--data", DATA_BIN, "--trust-checkpoint"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "not a fairseq checkpoint" in result.stderr and "truncated or corrupt" in result.stderr


def test_wrong_dictionary_and_our_own_checkpoint_are_refused(tmp_path, capsys):
    other_bin = tmp_path / "bin"
    shutil.copytree(DATA_BIN, other_bin)
    lines = (other_bin / "dict.txt").read_text().splitlines(keepends=True)
    (other_bin / "dict.txt").write_text("".join(lines[:-1]))  # one symbol fewer
    out = str(tmp_path / "out.pt")
    err = error_of(capsys, import_fairseq.main, [FAIRSEQ_CKPT, out, "--data", str(other_bin)])
    assert "embeds 360 symbols" in err and "359" in err

    import_fairseq.main([FAIRSEQ_CKPT, out, "--data", DATA_BIN])
    err = error_of(capsys, import_fairseq.main, [out, str(tmp_path / "again.pt"), "--data", DATA_BIN])
    assert "not a fairseq checkpoint" in err and "--path directly" in err
    # same size, other symbols: the fingerprint taken at import catches it
    (other_bin / "dict.txt").write_text("".join(["renamed 1\n", *lines[1:]]))
    err = error_of(capsys, validate.main, [str(other_bin), "--path", out])
    assert "trained on other data" in err


def test_unsupported_fairseq_options_are_named(fairseq_state):
    for key, value, words in (("adaptive_input", True, "adaptive input"),
                              ("scale_attn", True, "NormFormer"),
                              ("_name", "lstm_lm", "only transformer_lm")):
        state = copy.deepcopy(fairseq_state)
        state["cfg"]["model"][key] = value
        with pytest.raises(CheckpointError, match=words):
            to_shardtrain(state, "x.pt")


def test_learned_positions_and_shared_embeddings_map_onto_our_model():
    """fairseq names built from one of our models (the inverse mapping) convert back unchanged."""
    values = {"decoder_layers": 1, "decoder_embed_dim": 16, "decoder_ffn_embed_dim": 32,
              "decoder_attention_heads": 2, "decoder_learned_pos": True,
              "share_decoder_input_output_embed": True, "decoder_normalize_before": True, "max_target_positions": 64}
    cfg = from_dict({"task": {"data": DATA_BIN, "tokens_per_sample": 64}, "model": values})
    components = Components.of(cfg)
    task = build_task(cfg, components)
    ours = build_model(cfg, components, task).state_dict()
    pad = task.dictionary.pad()
    # fairseq numbers positions from padding_idx + 1, so its learned table has max + pad + 1 rows
    assert ours["embed_positions.weight"].shape[0] == 64 + pad + 1
    fairseq = {"decoder.version": torch.tensor([3.0]),
               "decoder.output_projection.weight": ours["embed_tokens.weight"]}
    for name, tensor in ours.items():
        if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
            for part, chunk in zip("qkv", tensor.chunk(3)):
                fairseq["decoder." + name.replace("blocks.", "layers.").replace("qkv_proj", f"{part}_proj")] = chunk
        else:
            fairseq["decoder." + name.replace("blocks.", "layers.")] = tensor
    converted = convert_weights(fairseq, values, "x.pt")
    assert converted.keys() == ours.keys()
    assert all(torch.equal(converted[k], ours[k]) for k in ours)


def test_allow_list_rebuilds_data_and_refuses_callables():
    unpickler = RestrictedUnpickler(io.BytesIO(b""))
    assert unpickler.find_class("collections", "OrderedDict").__name__ == "OrderedDict"
    assert unpickler.find_class("omegaconf.dictconfig", "DictConfig").__name__ == "DictConfig"
    assert unpickler.find_class("torch", "float16") is torch.float16
    stand_in = unpickler.find_class("fairseq.dataclass.constants", "Choices")
    assert issubclass(stand_in, FairseqStandIn) and stand_in("none").value == "none"
    for module, name in (("builtins", "eval"), ("__builtin__", "getattr"), ("os", "system"),
                         ("omegaconf", "OmegaConf"), ("torch", "load"), ("subprocess", "Popen")):
        with pytest.raises(pickle.UnpicklingError, match="allow-list"):
            unpickler.find_class(module, name)


def test_output_is_checked_first_and_replaced_only_with_overwrite(tmp_path, capsys):
    kept = tmp_path / "kept.pt"
    kept.write_text("precious")
    err = error_of(capsys, import_fairseq.main, [FAIRSEQ_CKPT, str(kept), "--data", DATA_BIN])
    assert "exists" in err and "--overwrite" in err and "nothing was overwritten" in err
    assert kept.read_text() == "precious"
    for output, words in ((tmp_path / "nodir" / "out.pt", "does not exist; create it first"),
                          (tmp_path, "is a directory")):
        err = error_of(capsys, import_fairseq.main, [FAIRSEQ_CKPT, str(output), "--data", DATA_BIN, "--overwrite"])
        assert words in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["kept.pt"]
    import_fairseq.main([FAIRSEQ_CKPT, str(kept), "--data", DATA_BIN, "--overwrite"])
    assert torch.load(kept, weights_only=True)["cfg"]["model"]["decoder_layers"] == 2


def test_damaged_files_are_named_without_torchs_unsafe_advice(tmp_path, fairseq_state, capsys):
    weights = dict(fairseq_state["model"])
    weights["decoder.layers.0.fc1.weight"] = "not a tensor"
    inputs = {"empty.pt": (b"", "is empty (0 bytes)"),
              "model_none.pt": ({**fairseq_state, "model": None}, "model entry is None"),
              "model_list.pt": ({**fairseq_state, "model": [1, 2]}, "model entry is a list"),
              "not_tensor.pt": ({**fairseq_state, "model": weights}, "'decoder.layers.0.fc1.weight' as a Python str"),
              "random_bytes.pt": (os.urandom(2048), "not a fairseq checkpoint"),
              "numpy.pt": ({"a": np.zeros(3)}, "pickles numpy"),
              "tensors.pt": ({"a": torch.zeros(3)}, "holds a dict with the keys ['a']")}
    for name, (content, words) in inputs.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            torch.save(content, path)
        err = error_of(capsys, import_fairseq.main, [str(path), str(tmp_path / "out.pt"), "--data", DATA_BIN])
        assert words in err, (name, err)
        assert "weights_only" not in err and "Re-running" not in err and err.count("\n") == 1
    assert not os.path.exists(tmp_path / "out.pt")
