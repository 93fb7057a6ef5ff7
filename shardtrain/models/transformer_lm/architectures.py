"""fairseq's ``transformer_lm`` architecture presets (fairseq 0.12 values).

Each preset returns ``{field: value}`` defaults; flags given explicitly
override them. Two deliberate differences from fairseq:

* fairseq's ``base_lm_architecture`` *forces* ``decoder_normalize_before`` and
  ``base_gpt3_architecture`` forces shared embeddings and input/output dims;
  here they are defaults like everything else, so flags can still change them.
* ``decoder_input_dim``/``decoder_output_dim`` default to the final
  ``decoder_embed_dim`` (as fairseq derives them). fairseq also derives GPT-3's
  ``decoder_ffn_embed_dim = 4 * embed``; a preset is a static dict, so that
  one is the preset's own: when overriding ``--decoder-embed-dim``, override
  ``--decoder-ffn-embed-dim`` too.

``transformer_lm_wiki103``'s adaptive cutoffs 20000,60000 need a dictionary of
more than 60000 symbols; with a smaller one override both cutoffs.
"""
from typing import Dict

from shardtrain.models.registry import register_model_architecture


def _base_lm(embed_dim: int, **values) -> Dict:
    """fairseq's ``base_lm_architecture`` on top of a preset's own values."""
    preset = {
        "decoder_embed_dim": embed_dim,
        # fairseq: "Model training is not stable without this".
        "decoder_normalize_before": True,
    }
    preset.update(values)
    return preset


def _gpt(embed_dim: int, ffn_dim: int, layers: int, heads: int) -> Dict:
    """The GPT/GPT-2 family: gelu, dropout 0.1, sinusoidal positions, untied."""
    return _base_lm(
        embed_dim,
        decoder_ffn_embed_dim=ffn_dim,
        decoder_layers=layers,
        decoder_attention_heads=heads,
        dropout=0.1,
        attention_dropout=0.1,
        activation_fn="gelu",
    )


def _gpt3(layers: int, embed_dim: int, heads: int) -> Dict:
    """fairseq's ``base_gpt3_architecture``: ffn 4x, learned positions, no
    dropout, gelu, shared input/output embeddings."""
    return _base_lm(
        embed_dim,
        decoder_layers=layers,
        decoder_attention_heads=heads,
        decoder_ffn_embed_dim=4 * embed_dim,
        decoder_learned_pos=True,
        dropout=0.0,
        attention_dropout=0.0,
        activation_fn="gelu",
        share_decoder_input_output_embed=True,
    )


def _big(**values) -> Dict:
    """fairseq's ``transformer_lm_big``, which the Baevski presets call after their own values."""
    preset = _base_lm(1024, decoder_layers=12, decoder_ffn_embed_dim=4096, decoder_attention_heads=16)
    preset.update(values)
    return preset


@register_model_architecture("transformer_lm", "transformer_lm_big")
def transformer_lm_big() -> Dict:
    return _big()


@register_model_architecture("transformer_lm", "transformer_lm_wiki103")
@register_model_architecture("transformer_lm", "transformer_lm_baevski_wiki103")
def transformer_lm_baevski_wiki103() -> Dict:
    # fairseq: adaptive input and softmax, tied, on transformer_lm_big with 16 layers and 8 heads.
    return _big(
        decoder_layers=16, decoder_attention_heads=8, dropout=0.3, attention_dropout=0.1,
        activation_dropout=0.1, adaptive_input=True, tie_adaptive_weights=True, tie_adaptive_proj=True,
        adaptive_input_cutoff="20000,60000", adaptive_softmax_cutoff="20000,60000",
        adaptive_softmax_dropout=0.2, no_decoder_final_norm=True,
    )


@register_model_architecture("transformer_lm", "transformer_lm_gbw")
@register_model_architecture("transformer_lm", "transformer_lm_baevski_gbw")
def transformer_lm_baevski_gbw() -> Dict:
    # fairseq: transformer_lm_big with a 512-dim embedding and no final norm.
    return _big(decoder_embed_dim=512, dropout=0.1, attention_dropout=0.1, no_decoder_final_norm=True)


@register_model_architecture("transformer_lm", "transformer_lm_gpt")
def transformer_lm_gpt() -> Dict:
    return _gpt(768, 3072, layers=12, heads=12)


@register_model_architecture("transformer_lm", "transformer_lm_gpt2_tiny")
def transformer_lm_gpt2_tiny() -> Dict:
    return _gpt(64, 64, layers=2, heads=1)


@register_model_architecture("transformer_lm", "transformer_lm_gpt2_small")
def transformer_lm_gpt2_small() -> Dict:
    return _gpt(1024, 4096, layers=24, heads=16)


@register_model_architecture("transformer_lm", "transformer_lm_gpt2_medium")
def transformer_lm_gpt2_medium() -> Dict:
    return _gpt(1280, 5120, layers=36, heads=20)


@register_model_architecture("transformer_lm", "transformer_lm_gpt2_big")
def transformer_lm_gpt2_big() -> Dict:
    return _gpt(1600, 6400, layers=48, heads=25)


@register_model_architecture("transformer_lm", "transformer_lm_gpt2_big_wide")
def transformer_lm_gpt2_big_wide() -> Dict:
    return _gpt(2048, 8192, layers=24, heads=32)


@register_model_architecture("transformer_lm", "transformer_lm_gpt2_bigger")
def transformer_lm_gpt2_bigger() -> Dict:
    return _gpt(2048, 8192, layers=48, heads=32)


@register_model_architecture("transformer_lm", "transformer_lm_gpt3_small")
def transformer_lm_gpt3_small() -> Dict:  # 125M parameters
    return _gpt3(layers=12, embed_dim=768, heads=12)


@register_model_architecture("transformer_lm", "transformer_lm_gpt3_medium")
def transformer_lm_gpt3_medium() -> Dict:  # 350M
    return _gpt3(layers=24, embed_dim=1024, heads=16)


@register_model_architecture("transformer_lm", "transformer_lm_gpt3_large")
def transformer_lm_gpt3_large() -> Dict:  # 760M
    return _gpt3(layers=24, embed_dim=1536, heads=16)


@register_model_architecture("transformer_lm", "transformer_lm_gpt3_xl")
def transformer_lm_gpt3_xl() -> Dict:  # 1.3B
    return _gpt3(layers=24, embed_dim=2048, heads=32)


@register_model_architecture("transformer_lm", "transformer_lm_gpt3_2_7")
def transformer_lm_gpt3_2_7() -> Dict:  # 2.7B
    return _gpt3(layers=32, embed_dim=2560, heads=32)


@register_model_architecture("transformer_lm", "transformer_lm_gpt3_6_7")
def transformer_lm_gpt3_6_7() -> Dict:  # 6.7B
    return _gpt3(layers=32, embed_dim=4096, heads=32)


@register_model_architecture("transformer_lm", "transformer_lm_gpt3_13")
def transformer_lm_gpt3_13() -> Dict:  # 13B
    return _gpt3(layers=40, embed_dim=5120, heads=40)


@register_model_architecture("transformer_lm", "transformer_lm_gpt3_175")
def transformer_lm_gpt3_175() -> Dict:  # 175B
    return _gpt3(layers=96, embed_dim=12288, heads=96)
