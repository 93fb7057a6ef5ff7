"""Hugging Face's ``config.json`` of a Llama or Qwen3 model and our ``LlamaConfig`` fields, both ways.

Read, not guessed: every size, eps and RoPE parameter comes from the file; a key the file leaves out takes
transformers' own default for that ``model_type`` (written out below, so a reader sees them). RoPE is read in
both spellings: transformers 5's ``rope_parameters`` and the older ``rope_theta`` + ``rope_scaling``; it is
written as transformers 5 reads it. What our model cannot be (biases, another activation, sliding windows,
other RoPE types) is refused, naming the key, rather than loaded as something else."""
from typing import Dict, Optional, Tuple

from shardtrain.core.errors import DataError
from shardtrain.models.llama.config import ffn_dim, head_dim, kv_heads

MODEL_TYPES = ("llama", "qwen3")
_CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# transformers 5.24's defaults where config.json leaves a key out (LlamaConfig, Qwen3Config)
_DEFAULTS = {"llama": {"rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "rope_theta": 10000.0},
             "qwen3": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "rope_theta": 10000.0,
                       "head_dim": 128}}
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
# our field <- the config.json key that sets it (for messages naming both)
SOURCES = {"decoder_embed_dim": "hidden_size", "decoder_layers": "num_hidden_layers",
           "decoder_attention_heads": "num_attention_heads", "decoder_kv_heads": "num_key_value_heads",
           "decoder_head_dim": "head_dim", "decoder_ffn_embed_dim": "intermediate_size",
           "rms_norm_eps": "rms_norm_eps", "share_decoder_input_output_embed": "tie_word_embeddings",
           "max_target_positions": "max_position_embeddings", "qk_norm": "model_type",
           "rope_theta": "rope_theta", "rope_factor": "rope factor", "rope_low_freq_factor": "low_freq_factor",
           "rope_high_freq_factor": "high_freq_factor",
           "rope_original_max_positions": "original_max_position_embeddings"}


def from_hf(config: Dict, where: str) -> Dict:
    """Our LlamaConfig values from a parsed config.json (``where`` names it in messages)."""
    model_type = config.get("model_type")
    missing = [key for key in _REQUIRED if key not in config]
    if missing:
        raise DataError(f"{where} has no {', '.join(missing)}: a Llama or Qwen3 config.json names every size. "
                        "Use the config.json that came with the weights.")
    _refuse_what_we_cannot_be(config, model_type, where)
    defaults = _DEFAULTS[model_type]
    heads = config["num_attention_heads"]
    values = {"decoder_embed_dim": config["hidden_size"], "decoder_layers": config["num_hidden_layers"],
              "decoder_attention_heads": heads, "decoder_kv_heads": config.get("num_key_value_heads") or heads,
              "decoder_head_dim": config.get("head_dim") or defaults.get("head_dim")
              or config["hidden_size"] // heads,
              "decoder_ffn_embed_dim": config["intermediate_size"],
              "rms_norm_eps": float(config.get("rms_norm_eps", defaults["rms_norm_eps"])),
              "share_decoder_input_output_embed": bool(config.get("tie_word_embeddings", False)),
              "max_target_positions": config.get("max_position_embeddings", defaults["max_position_embeddings"]),
              "qk_norm": model_type == "qwen3"}
    values.update(_rope(config, defaults["rope_theta"], where))
    return values


def _refuse_what_we_cannot_be(config: Dict, model_type, where: str) -> None:
    if model_type not in MODEL_TYPES:
        raise DataError(f"{where} has model_type {model_type!r}, which shardtrain does not load. Supported: "
                        f"{', '.join(MODEL_TYPES)} (the llama family: docs/coming_from_hf.md).")
    unsupported = [(key, config[key], want) for key, want in
                   (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False),
                    ("use_sliding_window", False)) if key in config and config[key] != want]
    if unsupported:
        said = "; ".join(f"{key} is {value!r} (shardtrain's llama has only {want!r})" for key, value, want in
                         unsupported)
        raise DataError(f"{where}: {said}. This model is not one shardtrain's llama family can be; it loads only "
                        "what it can compute exactly.")


def _rope(config: Dict, default_theta: float, where: str) -> Dict:
    """transformers 5: ``rope_parameters`` (theta inside); before: ``rope_theta`` + ``rope_scaling``."""
    params = config.get("rope_parameters")
    if params is None:
        params = dict(config.get("rope_scaling") or {})
        params.setdefault("rope_theta", config.get("rope_theta", default_theta))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise DataError(f"{where} asks for RoPE type {rope_type!r}; shardtrain's llama has 'default' and "
                        "'llama3' (Llama 3's frequency scaling) only.")
    values = {"rope_theta": float(params.get("rope_theta", default_theta)), "rope_factor": None}
    if rope_type == "llama3":
        values.update(rope_factor=float(params["factor"]), rope_low_freq_factor=float(params["low_freq_factor"]),
                      rope_high_freq_factor=float(params["high_freq_factor"]),
                      rope_original_max_positions=int(params["original_max_position_embeddings"]))
    return values


def to_hf(values: Dict, vocab_size: int, max_positions: Optional[int], dtype: str,
          extra: Optional[Dict] = None) -> Tuple[Dict, str]:
    """(config.json, the class transformers builds) for a model of our ``values``; ``max_positions`` stands in
    where max_target_positions is unset (the run's --tokens-per-sample); ``extra``: keys kept from the folder
    the run started from (token ids), never the sizes."""
    cfg = _Fields(values)
    model_type = "qwen3" if cfg.qk_norm else "llama"
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_factor is not None:
        rope.update(rope_type="llama3", factor=cfg.rope_factor, low_freq_factor=cfg.rope_low_freq_factor,
                    high_freq_factor=cfg.rope_high_freq_factor,
                    original_max_position_embeddings=cfg.rope_original_max_positions)
    config = {**(extra or {}), "architectures": [_CLASSES[model_type]], "model_type": model_type,
              "vocab_size": vocab_size, "hidden_size": cfg.decoder_embed_dim, "intermediate_size": ffn_dim(cfg),
              "num_hidden_layers": cfg.decoder_layers, "num_attention_heads": cfg.decoder_attention_heads,
              "num_key_value_heads": kv_heads(cfg), "head_dim": head_dim(cfg), "hidden_act": "silu",
              "rms_norm_eps": cfg.rms_norm_eps, "tie_word_embeddings": cfg.share_decoder_input_output_embed,
              "max_position_embeddings": cfg.max_target_positions or max_positions, "rope_parameters": rope,
              "attention_bias": False, "dtype": dtype}
    config.update({"mlp_bias": False} if model_type == "llama" else {"use_sliding_window": False})
    return config, _CLASSES[model_type]


def vocab_size(weights: Dict) -> int:
    """The rows of the embedding: the vocabulary a checkpoint's model was built with."""
    return weights["embed_tokens.weight"].shape[0]


class _Fields:
    """A values dict read as the config's attributes (config.py's helpers take either)."""

    def __init__(self, values: Dict):
        self.__dict__.update(values)
