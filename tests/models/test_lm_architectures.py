"""transformer_lm presets: registration, fairseq's values, parameter counts."""
import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from shardtrain.core.errors import ConfigError
from shardtrain.models import ARCH_REGISTRY, MODEL_REGISTRY
from shardtrain.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

# name: (layers, embed, ffn, heads) as in fairseq 0.12's transformer_lm.py
GPT2_SIZES = {
    "transformer_lm_gpt": (12, 768, 3072, 12),
    "transformer_lm_gpt2_small": (24, 1024, 4096, 16),
    "transformer_lm_gpt2_medium": (36, 1280, 5120, 20),
    "transformer_lm_gpt2_big": (48, 1600, 6400, 25),
}
GPT3_SIZES = {
    "transformer_lm_gpt3_small": (12, 768, 3072, 12),
    "transformer_lm_gpt3_medium": (24, 1024, 4096, 16),
    "transformer_lm_gpt3_large": (24, 1536, 6144, 16),
    "transformer_lm_gpt3_xl": (24, 2048, 8192, 32),
    "transformer_lm_gpt3_2_7": (32, 2560, 10240, 32),
    "transformer_lm_gpt3_6_7": (32, 4096, 16384, 32),
    "transformer_lm_gpt3_13": (40, 5120, 20480, 40),
    "transformer_lm_gpt3_175": (96, 12288, 49152, 96),
}


def preset(name):
    arch = ARCH_REGISTRY.get(name).obj
    assert arch.model == "transformer_lm"
    return arch.values()


def config_for(name, **overrides):
    return TransformerLanguageModelConfig(**{**preset(name), **overrides})


def test_model_is_registered_with_its_config():
    entry = MODEL_REGISTRY.get("transformer_lm")
    assert entry.obj is TransformerLanguageModel
    assert entry.config_cls is TransformerLanguageModelConfig
    assert "transformer_lm" in ARCH_REGISTRY  # the plain model name is an arch too
    structured = OmegaConf.structured(TransformerLanguageModelConfig)
    assert structured.max_target_positions is None and structured.decoder_layers == 6
    with pytest.raises(ConfigError, match="transformer_lm_gpt3_small"):
        ARCH_REGISTRY.get("transformer_lm_gpt3_smal")


@pytest.mark.parametrize("name", sorted(n for n in ARCH_REGISTRY.names()
                                         if ARCH_REGISTRY.get(n).obj.model == "transformer_lm" and n != "transformer_lm"))
def test_presets_only_set_config_fields(name):
    fields = {f.name for f in dataclasses.fields(TransformerLanguageModelConfig)}
    values = preset(name)
    assert values and set(values) <= fields
    assert values["decoder_normalize_before"] is True  # fairseq's base_lm_architecture
    # input/output dims follow the embed dim unless set, so a preset leaves them unset
    assert "decoder_input_dim" not in values and "decoder_output_dim" not in values
    config_for(name)  # the values have the right types for the dataclass


@pytest.mark.parametrize("name,sizes", sorted(GPT2_SIZES.items()))
def test_gpt2_family_presets(name, sizes):
    values = preset(name)
    got = (values["decoder_layers"], values["decoder_embed_dim"],
           values["decoder_ffn_embed_dim"], values["decoder_attention_heads"])
    assert got == sizes
    assert values["activation_fn"] == "gelu"
    assert values["dropout"] == 0.1 and values["attention_dropout"] == 0.1
    cfg = config_for(name)  # sinusoidal, untied: fairseq leaves the defaults
    assert not cfg.decoder_learned_pos and not cfg.share_decoder_input_output_embed


@pytest.mark.parametrize("name,sizes", sorted(GPT3_SIZES.items()))
def test_gpt3_family_presets(name, sizes):
    values = preset(name)
    got = (values["decoder_layers"], values["decoder_embed_dim"],
           values["decoder_ffn_embed_dim"], values["decoder_attention_heads"])
    assert got == sizes
    assert values["activation_fn"] == "gelu" and values["decoder_learned_pos"] is True
    assert values["share_decoder_input_output_embed"] is True
    assert values["dropout"] == 0.0 and values["attention_dropout"] == 0.0


def test_other_fairseq_presets():
    big = preset("transformer_lm_big")
    assert (big["decoder_layers"], big["decoder_embed_dim"], big["decoder_ffn_embed_dim"],
            big["decoder_attention_heads"]) == (12, 1024, 4096, 16)
    gbw = preset("transformer_lm_gbw")
    assert gbw == preset("transformer_lm_baevski_gbw")
    assert gbw["decoder_embed_dim"] == 512 and gbw["no_decoder_final_norm"] is True
    assert gbw["attention_dropout"] == 0.1


def _expected_count(vocab, positions_rows, embed, ffn, layers, tied, final_norm):
    attention = 4 * (embed * embed + embed)
    feed_forward = embed * ffn + ffn + ffn * embed + embed
    layer_norms = 2 * 2 * embed
    total = vocab * embed + positions_rows * embed + layers * (attention + feed_forward + layer_norms)
    total += 2 * embed if final_norm else 0
    total += 0 if tied else vocab * embed
    return total


def test_parameter_counts_match_fairseq_configs():
    vocab, pad = 50264, 1  # fairseq's GPT-2 BPE dictionary with its 4 specials
    with torch.device("meta"):
        gpt2 = TransformerLanguageModel(config_for("transformer_lm_gpt2_small"), vocab, pad, 1024)
        gpt3 = TransformerLanguageModel(config_for("transformer_lm_gpt3_small"), vocab, pad, 2048)
    # gpt2_small: sinusoidal positions (no parameters), separate output matrix.
    assert sum(p.numel() for p in gpt2.parameters()) == _expected_count(vocab, 0, 1024, 4096, 24, False, True)
    # gpt3_small: learned positions with fairseq's padding_idx + 1 extra rows, tied.
    expected = _expected_count(vocab, 2048 + pad + 1, 768, 3072, 12, True, True)
    assert sum(p.numel() for p in gpt3.parameters()) == expected
    assert all(p.requires_grad for p in [*gpt2.parameters(), *gpt3.parameters()])  # every one trained
    assert 124_000_000 < expected < 126_000_000  # fairseq's "125M params"
