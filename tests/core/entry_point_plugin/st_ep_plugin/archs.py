"""Named by a module entry point: importing it registers an architecture."""
from shardtrain.models import register_model_architecture


@register_model_architecture("transformer_lm", "ep_tiny_lm")
def ep_tiny_lm():
    return {"decoder_layers": 1, "decoder_embed_dim": 24, "decoder_ffn_embed_dim": 40,
            "decoder_attention_heads": 2}
