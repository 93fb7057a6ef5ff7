"""Tiny random Hugging Face model folders, saved by transformers itself (the reference), and its logits on a prompt
(hf_folders.py holds the tokenizer folders)."""
import json
import os

import pytest
import torch
import transformers

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.checkpoint.hf_folder import load_folder_into
from shardtrain.trainer.resolved import Components, build_model, build_task
from st_testutils import make_space_data_bin

PROMPT_LENGTH = 24

KINDS = {
    # Llama 3 scaling with factor 32 at positions beyond the original context (8), GQA, untied
    "llama": ("LlamaForCausalLM", dict(
        hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=64,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8})),
    # q/k norms, a head width apart from width / heads, tied
    "qwen3": ("Qwen3ForCausalLM", dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
}


def save_tiny(kind: str, folder: str, vocab: int, seed: int = 0, max_shard_size="6KB", **overrides):
    """A random ``kind`` model with ``vocab`` tokens saved into ``folder`` (several files at the default
    ``max_shard_size``); its norms moved off ones so that they matter. Returns the HF model (fp32, eval)."""
    hf_class, kwargs = KINDS[kind]
    torch.manual_seed(seed)
    config_cls = getattr(transformers, hf_class.replace("ForCausalLM", "Config"))
    config = config_cls(vocab_size=vocab, attn_implementation="eager", **{**kwargs, **overrides})
    model = getattr(transformers, hf_class)(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.3)
    model.save_pretrained(folder, max_shard_size=max_shard_size)
    return model


def safetensors_files(folder: str):
    return sorted(name for name in os.listdir(folder) if name.endswith(".safetensors"))


def tensors_of(folder: str):
    """Every tensor of the folder's safetensors files, by Hugging Face's name; each file's metadata checked to be
    {"format": "pt"} (transformers' loader refuses others)."""
    from safetensors import safe_open
    out = {}
    for name in safetensors_files(folder):
        with safe_open(os.path.join(folder, name), "pt") as f:
            assert f.metadata() == {"format": "pt"}, name
            out.update({key: f.get_tensor(key) for key in f.keys()})
    return out


def rewrite_config(folder: str, **changes):
    """config.json with keys changed (None removes one)."""
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    with open(path, "w") as f:
        json.dump(config, f)


def prompt(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, PROMPT_LENGTH), generator=torch.Generator().manual_seed(5))


def reference_logits(folder: str, vocab: int) -> torch.Tensor:
    """transformers' own model loaded from ``folder``, on the fixed prompt."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    with torch.no_grad():
        return model(prompt(vocab)).logits


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    """16 symbols: the tiny folders are saved with that vocabulary."""
    return make_space_data_bin(str(tmp_path_factory.mktemp("hf_bin")), n_words=8, train_tokens=600,
                               valid_tokens=100, line_len=20)


def vocab(data_bin):
    with open(os.path.join(data_bin, "dict.txt")) as f:
        return 4 + sum(1 for _ in f)  # fairseq's 4 special symbols, then one line a word


def imported(data_bin, folder, *flags):
    """(config, model) as shard-train builds and fills them from ``folder``, on one process, no run."""
    cfg = parse_train_args([data_bin, "--finetune-from-model", folder, "--tokens-per-sample", "32", "--cpu",
                            *flags])
    components = Components.of(cfg)
    model = build_model(cfg, components, build_task(cfg, components))
    load_folder_into(model, folder)
    return cfg, model.eval()
