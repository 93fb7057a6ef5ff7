"""Positions are added in the dtype of the embeddings, whatever the dtype of their table.

FSDP2's mixed precision casts a model's parameters, not its buffers: the sinusoidal table stays
fp32 while the embeddings come out bf16. Mimicked here without processes by casting the
parameters alone (the full backends x precisions matrix: tests/helpers/precision_mains.py).
"""
import pytest
import torch

from shardtrain.models.positions import sinusoidal_table
from shardtrain.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

VOCAB, PAD, MAX_POS = 19, 1, 24


def params_only_to(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


@pytest.mark.parametrize("learned", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_parameters_with_an_fp32_table(learned, dtype):
    cfg = TransformerLanguageModelConfig(decoder_embed_dim=16, decoder_ffn_embed_dim=24, decoder_layers=2,
                                         decoder_attention_heads=4, layernorm_embedding=True,
                                         decoder_learned_pos=learned, dropout=0.0)
    model = params_only_to(TransformerLanguageModel(cfg, VOCAB, PAD, MAX_POS), dtype)
    if not learned:
        assert model.embed_positions.weights.dtype == torch.float32  # the buffer FSDP leaves alone
    tokens = torch.randint(PAD + 1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(0))
    seen = []
    model.layernorm_embedding.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    logits = model(tokens)  # used to fail: "mixed dtype (CPU)" in layernorm_embedding
    assert seen == [dtype] and logits.dtype == dtype
    assert torch.isfinite(logits.float()).all()


def test_the_table_is_cast_only_when_asked():
    model = TransformerLanguageModel(TransformerLanguageModelConfig(decoder_embed_dim=16, decoder_layers=0),
                                     VOCAB, PAD, MAX_POS)
    positions = torch.arange(PAD + 1, PAD + 7)[None]
    table = sinusoidal_table(MAX_POS + PAD + 1, 16, PAD)
    assert torch.equal(model.embed_positions(positions), table[positions])  # full fp32 by default
    assert torch.equal(model.embed_positions(positions, torch.bfloat16), table[positions].to(torch.bfloat16))
