"""--decoder-layerdrop (fairseq 0.12's TransformerDecoder: a layer runs when its uniform
draw exceeds p, while training only)."""
import torch

from shardtrain.models.layerdrop import LayerDrop
from shardtrain.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig


def build(p, layers=6):
    torch.manual_seed(0)
    cfg = TransformerLanguageModelConfig(decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_layers=layers,
                                         decoder_attention_heads=2, dropout=0.0, decoder_layerdrop=p)
    return TransformerLanguageModel(cfg, 20, 1, 32)


def test_draws_are_fairseqs_rule_and_the_same_for_the_same_seed():
    a, b = LayerDrop(0.3), LayerDrop(0.3)
    draws = torch.rand(1000, generator=torch.Generator().manual_seed(a.generator.initial_seed()))
    kept = a.keep(1000, training=True)
    assert kept == (draws > 0.3).tolist() == b.keep(1000, training=True)  # what every rank draws
    assert 600 < sum(kept) < 800
    assert a.keep(5, training=False) == [True] * 5 and LayerDrop(0.0).keep(3, True) == [True] * 3
    state = a.state_dict()
    first = a.keep(10, True)
    a.load_state_dict(state)
    assert a.keep(10, True) == first


def test_eval_runs_every_block_and_training_skips_with_zero_gradients():
    model, plain = build(0.5), build(0.0)
    tokens = torch.randint(2, 20, (2, 7))
    model.eval(), plain.eval()
    torch.testing.assert_close(model(tokens), plain(tokens))  # no layer dropped at evaluation
    model.train()
    state = model.layerdrop.state_dict()
    kept = model.layerdrop.keep(6, True)
    model.layerdrop.load_state_dict(state)
    assert 0 < sum(kept) < 6
    model(tokens).sum().backward()
    for index, block in enumerate(model.blocks):
        grads = [p.grad for p in block.parameters()]
        assert all(g is not None for g in grads)  # every parameter takes part (DDP, optimizers)
        touched = any(g.abs().sum() > 0 for g in grads)
        assert touched == kept[index], index
    # the skipped blocks change nothing: the same as a model of only the kept blocks
    only = build(0.0, layers=sum(kept)).train()
    only.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("blocks.")}, strict=False)
    for target, source in zip(only.blocks, [b for b, k in zip(model.blocks, kept) if k]):
        target.load_state_dict(source.state_dict())
    model.layerdrop.load_state_dict(state)
    torch.testing.assert_close(model(tokens), only(tokens))


def test_relu_dropout_is_fairseqs_fallback_for_activation_dropout():
    def activation_p(**values):
        cfg = TransformerLanguageModelConfig(decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_layers=1,
                                             decoder_attention_heads=2, **values)
        return TransformerLanguageModel(cfg, 20, 1, 32).blocks[0].activation_dropout.p

    # fairseq's TransformerDecoderLayer: activation_dropout, or relu_dropout when that is 0
    assert activation_p(relu_dropout=0.2) == 0.2
    assert activation_p(relu_dropout=0.2, activation_dropout=0.3) == 0.3
    assert activation_p() == 0.0


def test_fairseq_import_keeps_the_layerdrop_of_the_checkpoint():
    from shardtrain.models.transformer_lm.fairseq_checkpoint import model_values

    values = model_values({"_name": "transformer_lm", "decoder_layerdrop": 0.2}, {}, "checkpoint.pt")
    assert values["decoder_layerdrop"] == 0.2  # fine-tuning goes on dropping layers, as in fairseq
