"""KV-cache equivalence and fairseq-style sampling."""
import math

import pytest
import torch

from shardtrain.core.errors import ConfigError, ShardtrainError
from shardtrain.models.sampling import choose_next, sample
from shardtrain.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig

VOCAB, PAD, MAX_POS = 19, 1, 24


def tiny_model(seed=0, **overrides) -> TransformerLanguageModel:
    values = dict(
        decoder_embed_dim=16, decoder_input_dim=16, decoder_output_dim=16,
        decoder_ffn_embed_dim=24, decoder_layers=2, decoder_attention_heads=4,
        attention_dropout=0.1, activation_dropout=0.1,
    )
    values.update(overrides)
    torch.manual_seed(seed)
    return TransformerLanguageModel(TransformerLanguageModelConfig(**values), VOCAB, PAD, MAX_POS)


def prompt(length=5, seed=0):
    return torch.randint(PAD + 1, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("overrides", [
    dict(),
    dict(decoder_normalize_before=True, decoder_learned_pos=True, layernorm_embedding=True),
])
def test_kv_cache_logits_equal_full_recompute(overrides):
    model = tiny_model(**overrides).eval()
    x = torch.randint(PAD + 1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    full = model(x)
    cache = model.new_kv_cache()
    pieces = [model(x[:, :5], cache=cache), model(x[:, 5:8], cache=cache)]  # prefill, then a chunk
    pieces += [model(x[:, t:t + 1], cache=cache) for t in range(8, 12)]  # one token at a time
    assert cache.length == 12
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)


def test_kv_cache_respects_max_positions():
    model = tiny_model().eval()
    cache = model.new_kv_cache()
    model(prompt(MAX_POS - 1).view(1, -1), cache=cache)
    model(prompt(1).view(1, -1), cache=cache)
    with pytest.raises(ConfigError, match="positions"):
        model(prompt(1).view(1, -1), cache=cache)


def _greedy_by_full_recompute(model, ids, steps):
    ids = ids.clone()
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model.eval()(ids.view(1, -1))[0, -1]
            logits[PAD] = -math.inf
            out.append(int(logits.argmax()))
            ids = torch.cat([ids, torch.tensor([out[-1]])])
    return out


def test_greedy_matches_independent_loop_and_restores_train_mode():
    model = tiny_model()
    assert model.training
    got = sample(model, prompt(), max_len=8, greedy=True)
    assert model.training
    assert got.tolist() == _greedy_by_full_recompute(model, prompt(), 8)
    assert sample(model, prompt(), max_len=8, greedy=True, use_cache=False).tolist() == got.tolist()


def test_max_len_and_eos_stop_generation():
    model = tiny_model()
    free = sample(model, prompt(), max_len=10, greedy=True)
    assert free.numel() == 10 and free.dtype == torch.long
    eos = int(free[3])
    first = free.tolist().index(eos)
    stopped = sample(model, prompt(), max_len=10, greedy=True, eos=eos)
    assert stopped.tolist() == free[: first + 1].tolist()
    assert sample(model, prompt(), max_len=0).numel() == 0


def test_generation_stops_at_max_positions():
    model = tiny_model()
    out = sample(model, prompt(MAX_POS - 3), max_len=10, topk=5, generator=torch.Generator().manual_seed(0))
    assert out.numel() == 3
    with pytest.raises(ShardtrainError, match="positions"):
        sample(model, prompt(MAX_POS + 1), max_len=1)


def test_topk_one_and_tiny_topp_equal_greedy():
    model = tiny_model()
    greedy = sample(model, prompt(), max_len=10, greedy=True).tolist()
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        assert sample(model, prompt(), max_len=10, topk=1, generator=gen, temperature=3.0).tolist() == greedy
        gen = torch.Generator().manual_seed(seed)
        assert sample(model, prompt(), max_len=10, topp=1e-6, topk=7, generator=gen).tolist() == greedy


def test_sampling_is_reproducible_and_cache_independent():
    model = tiny_model()
    runs = [
        sample(model, prompt(), max_len=12, generator=torch.Generator().manual_seed(7), use_cache=cache)
        for cache in (True, False, True)
    ]
    assert runs[0].tolist() == runs[1].tolist() == runs[2].tolist()


def _frequencies(logits, draws=3000, **kwargs):
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(logits.numel())
    for _ in range(draws):
        counts[choose_next(logits, generator=gen, greedy=False, **kwargs)] += 1
    return counts / draws


def test_temperature_scales_logits_before_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    freq = _frequencies(logits, temperature=2.0, topk=0, topp=0.0)
    expected = torch.softmax(logits / 2.0, dim=0)
    torch.testing.assert_close(freq, expected, rtol=0, atol=0.04)


def test_topk_and_topp_keep_fairseqs_sets():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    logits = probs.log()
    # top-p 0.7: 0.5 < 0.7, then 0.3 crosses it and is kept too.
    freq = _frequencies(logits, temperature=1.0, topk=0, topp=0.7)
    assert set(torch.nonzero(freq).flatten().tolist()) == {1, 3}
    torch.testing.assert_close(freq[[1, 3]], torch.tensor([0.5, 0.3]) / 0.8, rtol=0, atol=0.04)
    # top-p takes precedence over top-k, as in fairseq.
    freq = _frequencies(logits, temperature=1.0, topk=3, topp=0.45)
    assert torch.nonzero(freq).flatten().tolist() == [1]
    freq = _frequencies(logits, temperature=1.0, topk=3, topp=0.0)
    assert set(torch.nonzero(freq).flatten().tolist()) == {1, 2, 3}


def test_padding_is_never_chosen():
    logits = torch.zeros(VOCAB)
    logits[PAD] = 100.0
    assert int(choose_next(logits, 1.0, 0, 0.0, None, True, PAD)) != PAD
    freq = _frequencies(logits, draws=300, temperature=1.0, topk=1, topp=0.0, padding_idx=PAD)
    assert freq[PAD] == 0


def test_bad_sampling_settings_are_config_errors():
    model = tiny_model()
    with pytest.raises(ConfigError, match="--temperature"):
        sample(model, prompt(), max_len=3, temperature=0.0)
    with pytest.raises(ConfigError, match="--sampling-topp"):
        sample(model, prompt(), max_len=3, topp=1.5)
    with pytest.raises(ShardtrainError, match="non-empty"):
        sample(model, torch.tensor([], dtype=torch.long), max_len=3)


def test_sample_lines_sees_the_lines_before_it_within_the_models_positions(monkeypatch):
    """Each line's prompt is the text so far with an end-of-sentence after every line (as training data
    has them), cut to the positions the model has left after room for the line."""
    from shardtrain.models import sampling

    eos, prompts, real_sample = 2, [], sampling.sample
    monkeypatch.setattr(sampling, "sample", lambda model, ids, *a, **kw: prompts.append(ids) or
                        real_sample(model, ids, *a, **kw))
    context = torch.cat([torch.tensor([eos]), prompt(4)])
    lines = sampling.sample_lines(tiny_model().eval(), context, 12, eos, max_line_len=6,
                                  generator=torch.Generator().manual_seed(0))
    assert len(lines) == 12 and all(len(line) <= 6 and eos not in line for line in lines)
    text = context.tolist()
    for line, seen in zip(lines, prompts):
        assert seen.tolist() == text[-(MAX_POS - 6):]
        text += line + [eos]
    assert len(text) > MAX_POS  # so the cut was needed
