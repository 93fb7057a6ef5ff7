"""config.json <-> LlamaConfig fields, both ways, with every expected value written by hand (from the published
meaning of each key: transformers' LlamaConfig and Qwen3Config docs), both RoPE spellings, and the refusals."""
import pytest

from shardtrain.core.errors import DataError
from shardtrain.models.llama.hf_config import from_hf, to_hf

LLAMA_3_2_1B = {  # meta-llama/Llama-3.2-1B's config.json (transformers 4 spelling), the keys that matter
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True, "max_position_embeddings": 131072, "vocab_size": 128256, "hidden_act": "silu",
    "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
QWEN3_0_6B = {  # Qwen/Qwen3-0.6B's config.json, the keys that matter
    "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "max_position_embeddings": 40960, "vocab_size": 151936, "rope_theta": 1000000,
    "rope_scaling": None, "use_sliding_window": False, "attention_bias": False}


def test_llama_3_2_1b_in_the_older_rope_spelling():
    assert from_hf(LLAMA_3_2_1B, "c") == {
        "decoder_embed_dim": 2048, "decoder_layers": 16, "decoder_attention_heads": 32, "decoder_kv_heads": 8,
        "decoder_head_dim": 64, "decoder_ffn_embed_dim": 8192, "rms_norm_eps": 1e-5,
        "share_decoder_input_output_embed": True, "max_target_positions": 131072, "qk_norm": False,
        "rope_theta": 500000.0, "rope_factor": 32.0, "rope_low_freq_factor": 1.0, "rope_high_freq_factor": 4.0,
        "rope_original_max_positions": 8192}


def test_transformers_5_rope_parameters_read_as_the_older_spelling():
    newer = {k: v for k, v in LLAMA_3_2_1B.items() if k not in ("rope_theta", "rope_scaling")}
    newer["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192}
    assert from_hf(newer, "c") == from_hf(LLAMA_3_2_1B, "c")
    newer["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 1000.0, "factor": 8.0,
                                "low_freq_factor": 2.0, "high_freq_factor": 3.0,
                                "original_max_position_embeddings": 512}
    got = from_hf(newer, "c")
    assert (got["rope_theta"], got["rope_factor"], got["rope_low_freq_factor"], got["rope_high_freq_factor"],
            got["rope_original_max_positions"]) == (1000.0, 8.0, 2.0, 3.0, 512)


def test_qwen3_0_6b_and_transformers_defaults_for_keys_left_out():
    got = from_hf(QWEN3_0_6B, "c")
    assert got == {"decoder_embed_dim": 1024, "decoder_layers": 28, "decoder_attention_heads": 16,
                   "decoder_kv_heads": 8, "decoder_head_dim": 128, "decoder_ffn_embed_dim": 3072,
                   "rms_norm_eps": 1e-6, "share_decoder_input_output_embed": True, "max_target_positions": 40960,
                   "qk_norm": True, "rope_theta": 1000000.0, "rope_factor": None}
    bare = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 10}
    got = from_hf(bare, "c")  # Qwen3Config: head_dim 128, eps 1e-6, 32768 positions, theta 10000, untied, MHA
    assert (got["decoder_head_dim"], got["rms_norm_eps"], got["max_target_positions"], got["rope_theta"],
            got["share_decoder_input_output_embed"], got["decoder_kv_heads"]) == (128, 1e-6, 32768, 10000.0,
                                                                                 False, 4)
    got = from_hf({**bare, "model_type": "llama"}, "c")  # LlamaConfig: head_dim width / heads, 2048 positions
    assert (got["decoder_head_dim"], got["max_target_positions"], got["qk_norm"]) == (16, 2048, False)


def test_our_fields_written_as_transformers_5_reads_them():
    ours = from_hf(LLAMA_3_2_1B, "c")
    config, cls = to_hf({**ours, "ffn_multiple_of": 256, "ffn_dim_multiplier": None}, 128256, None, "float32",
                        extra={"bos_token_id": 128000, "hidden_size": 1})
    assert cls == "LlamaForCausalLM"
    assert config == {
        "bos_token_id": 128000, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True, "max_position_embeddings": 131072, "attention_bias": False, "mlp_bias": False,
        "dtype": "float32",
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    qwen, cls = to_hf({**from_hf(QWEN3_0_6B, "c"), "max_target_positions": None}, 151936, 4096, "bfloat16")
    assert cls == "Qwen3ForCausalLM" and qwen["model_type"] == "qwen3" and qwen["use_sliding_window"] is False
    assert qwen["rope_parameters"] == {"rope_type": "default", "rope_theta": 1000000.0}
    assert (qwen["max_position_embeddings"], qwen["dtype"], qwen["head_dim"]) == (4096, "bfloat16", 128)
    assert from_hf(qwen, "c") == {**from_hf(QWEN3_0_6B, "c"), "max_target_positions": 4096}


@pytest.mark.parametrize("change, words", [
    ({"model_type": "mistral"}, "Supported: llama, qwen3"),
    ({"hidden_act": "gelu"}, "hidden_act is 'gelu'"),
    ({"attention_bias": True}, "attention_bias is True"),
    ({"use_sliding_window": True}, "use_sliding_window is True"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE type 'yarn'"),
    ({"hidden_size": None}, "has no hidden_size"),
])
def test_what_the_model_cannot_be_is_refused_by_key(change, words):
    config = {k: v for k, v in {**QWEN3_0_6B, **change}.items() if v is not None or k == "rope_scaling"}
    with pytest.raises(DataError, match="^c") as caught:
        from_hf(config, "c")
    assert words in str(caught.value)
