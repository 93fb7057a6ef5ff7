"""The ``llama`` family gives Hugging Face's numbers: tiny random ``LlamaForCausalLM`` and ``Qwen3ForCausalLM``
models (transformers is the reference, in the [test] extra only), their weights copied into ours by
``llama/hf_keys.py``; in fp32 on the CPU the logits agree within 1e-5 (max absolute), the loss and every
parameter's gradient within 1e-5 relative. Covered: grouped-query and full attention, tied and untied
embeddings, Llama 3 scaling with factor 32 at positions far beyond the original context (16), Qwen3's q/k norms
and a head width apart from width / heads, and both eps values."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import transformers  # the [test] extra installs it: a missing reference fails, never skips

from shardtrain.models.llama import LlamaConfig, LlamaModel  # noqa: E402
from shardtrain.models.llama.hf_keys import to_hf, to_ours  # noqa: E402

VOCAB, LENGTH = 96, 80  # positions up to 79: five times the original context of the scaled cases


def _llama3_scaling(factor=32.0):
    return {"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


CASES = {
    # name: (HF class, HF config kwargs, our config)
    "llama3 GQA untied, factor 32": (
        "LlamaForCausalLM",
        dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, rms_norm_eps=1e-5, tie_word_embeddings=False,
             rope_parameters=_llama3_scaling()),
        dict(decoder_embed_dim=64, decoder_ffn_embed_dim=96, decoder_layers=2, decoder_attention_heads=8,
             decoder_kv_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0, rope_factor=32.0,
             rope_original_max_positions=16)),
    "llama full attention tied, no scaling": (
        "LlamaForCausalLM",
        dict(hidden_size=32, intermediate_size=80, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        dict(decoder_embed_dim=32, decoder_ffn_embed_dim=80, decoder_layers=3, decoder_attention_heads=4,
             rms_norm_eps=1e-6, rope_theta=10000.0, share_decoder_input_output_embed=True)),
    "qwen3 GQA tied, head_dim 16": (
        "Qwen3ForCausalLM",
        dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        dict(decoder_embed_dim=32, decoder_ffn_embed_dim=64, decoder_layers=2, decoder_attention_heads=4,
             decoder_kv_heads=2, decoder_head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True,
             share_decoder_input_output_embed=True)),
    "qwen3 untied, full attention": (
        "Qwen3ForCausalLM",
        dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, head_dim=8, rms_norm_eps=1e-6, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        dict(decoder_embed_dim=48, decoder_ffn_embed_dim=64, decoder_layers=2, decoder_attention_heads=4,
             decoder_head_dim=8, rms_norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True)),
}


def _pair(name):
    hf_class, hf_kwargs, ours_kwargs = CASES[name]
    torch.manual_seed(0)
    config_cls = getattr(transformers, hf_class.replace("ForCausalLM", "Config"))
    hf = getattr(transformers, hf_class)(config_cls(vocab_size=VOCAB, max_position_embeddings=128,
                                                    attn_implementation="eager", **hf_kwargs)).float()
    with torch.no_grad():  # norms start at ones in both: make them matter
        for key, param in hf.named_parameters():
            if key.endswith("norm.weight"):
                param.add_(torch.randn_like(param) * 0.3)
    ours = LlamaModel(dataclasses.replace(LlamaConfig(), **ours_kwargs), VOCAB, 128)
    theirs = hf.state_dict()
    loaded = {to_ours(key): value for key, value in theirs.items()
              if not (key == "lm_head.weight" and ours.output_projection is None)}
    assert None not in loaded
    ours.load_state_dict(loaded, strict=True)
    return hf, ours


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request):
    return _pair(request.param)


def _inputs():
    generator = torch.Generator().manual_seed(1)
    return (torch.randint(0, VOCAB, (2, LENGTH), generator=generator),
            torch.randint(0, VOCAB, (2, LENGTH), generator=generator))


def test_logits_agree_within_1e_5(pair):
    hf, ours = pair
    tokens, _ = _inputs()
    with torch.no_grad():
        expected, got = hf(tokens).logits, ours(tokens)
    assert got.shape == expected.shape == (2, LENGTH, VOCAB)
    assert (got - expected).abs().max().item() <= 1e-5


def test_loss_and_every_gradient_agree_within_1e_5_relative(pair):
    hf, ours = pair
    tokens, target = _inputs()
    hf.zero_grad(), ours.zero_grad()
    expected = F.cross_entropy(hf(tokens).logits.view(-1, VOCAB), target.view(-1), reduction="sum")
    got = F.cross_entropy(ours(tokens).view(-1, VOCAB), target.view(-1), reduction="sum")
    assert abs(got.item() - expected.item()) <= 1e-5 * abs(expected.item())
    expected.backward(), got.backward()
    theirs = dict(hf.named_parameters())
    for name, param in ours.named_parameters():
        reference = theirs[to_hf(name)].grad
        worst = (param.grad - reference).abs().max().item()
        assert worst <= 1e-5 * reference.abs().max().item(), f"{name}: {worst:.3g}"


def test_the_kv_cache_gives_what_recomputing_the_prefix_gives(pair):
    _, ours = pair
    tokens, _ = _inputs()
    with torch.no_grad():
        whole = ours(tokens)
        cache = ours.new_kv_cache()
        parts = [ours(tokens[:, :50], cache=cache)] + [ours(tokens[:, t:t + 1], cache=cache)
                                                       for t in range(50, 60)] + [ours(tokens[:, 60:], cache=cache)]
    assert (torch.cat(parts, dim=1) - whole).abs().max().item() <= 1e-5


def test_the_key_map_round_trips_and_names_every_hf_weight():
    hf, ours = _pair("llama3 GQA untied, factor 32")
    assert sorted(to_hf(name) for name in ours.state_dict()) == sorted(hf.state_dict())
    assert to_ours("model.layers.11.self_attn.k_norm.weight") == "blocks.11.self_attn.k_norm.weight"
    assert to_ours("model.rotary_emb.inv_freq") is None
