"""Sampling continuations from a language model, the way fairseq samples.

Filtering follows fairseq's ``Sampling`` search: logits are divided by the
temperature before ``log_softmax``; ``topp > 0`` keeps the smallest set of
most likely tokens whose probability reaches ``topp`` and then *ignores*
``topk``; otherwise ``topk > 0`` keeps the ``topk`` most likely tokens. The
padding symbol is never produced. With a KV cache the prompt is run once and
each new token costs one position; generation stops at ``eos``, after
``max_len`` new tokens, or when the model runs out of positions.
"""
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from shardtrain.core.errors import ConfigError, ShardtrainError
from shardtrain.models import capabilities


@torch.no_grad()
def sample(
    model,
    prompt_ids: torch.Tensor,
    max_len: int,
    temperature: float = 1.0,
    topk: int = 0,
    topp: float = 0.0,
    eos: Optional[int] = None,
    generator: Optional[torch.Generator] = None,
    greedy: bool = False,
    use_cache: bool = True,
    pad: Optional[int] = None,
) -> torch.Tensor:
    """Continue ``prompt_ids`` [T]; return the new tokens (ending with ``eos``
    if it was produced), at most ``max_len`` of them.

    ``model``: anything with ``forward(tokens)``; ``new_kv_cache()`` with ``forward(tokens, cache=...)``,
    ``padding_idx`` and ``max_positions`` are used when it has them (models/capabilities.py), as a
    :class:`~shardtrain.models.transformer_lm.TransformerLanguageModel` does. It runs in eval mode; its
    train/eval mode is restored afterwards.
    """
    return sample_scored(model, prompt_ids, max_len, temperature, topk, topp, eos, generator, greedy,
                         use_cache, force_eos=False, pad=pad)[0]


@torch.no_grad()
def sample_scored(model, prompt_ids: torch.Tensor, max_len: int, temperature: float = 1.0, topk: int = 0,
                  topp: float = 0.0, eos: Optional[int] = None, generator: Optional[torch.Generator] = None,
                  greedy: bool = False, use_cache: bool = True, force_eos: bool = True,
                  on_step: Optional[Callable[[], None]] = None, pad: Optional[int] = None):
    """:func:`sample`, and fairseq's positional scores (``on_step`` is called once per token): -> (new tokens, log-probs [base e] of
    ``prompt_ids[1:]`` (``prompt_ids[0]`` is the end-of-sentence it starts after) and of every new token, under the temperature's distribution, unfiltered by
    top-k/top-p, as fairseq's ``SequenceGenerator`` scores them). ``force_eos``: when the budget ends
    without ``eos``, append it with its log-prob, as fairseq ends every hypothesis at its maximum length.
    ``pad``: the dictionary's padding symbol, never produced (for a model without ``padding_idx``)."""
    _check_sampling_args(prompt_ids, max_len, temperature, topk, topp, capabilities.max_positions(model))
    budget = capabilities.room_after(model, prompt_ids.numel(), max_len)
    use_cache = use_cache and capabilities.has_kv_cache(model)
    cache = model.new_kv_cache() if use_cache else None
    pad = capabilities.padding_idx(model, pad)
    new_tokens, scores = [], []
    was_training = model.training
    model.eval()
    try:
        logits = _forward(model, prompt_ids.view(1, -1), cache)[0]
        scores += _log_probs(logits[:-1], temperature).gather(1, prompt_ids[1:].view(-1, 1)).view(-1).tolist()
        logits = logits[-1]
        for step in range(budget + 1):
            if on_step is not None:
                on_step()
            if step == budget:  # out of budget: fairseq forces eos as the last token
                if not force_eos or eos is None:
                    break
                token = torch.tensor(eos, device=prompt_ids.device)
            else:
                token = choose_next(logits, temperature, topk, topp, generator, greedy, pad)
            new_tokens.append(token)
            scores.append(float(_log_probs(logits, temperature)[token]))
            if eos is not None and token.item() == eos:
                break
            if step + 1 < budget or force_eos:
                tokens = (token.view(1, 1) if use_cache else
                          torch.cat([prompt_ids, torch.stack(new_tokens)]).view(1, -1))
                logits = _forward(model, tokens, cache)[0, -1]
    finally:
        model.train(was_training)
    if not new_tokens:
        return prompt_ids.new_empty(0), scores
    return torch.stack(new_tokens), scores


def _forward(model, tokens: torch.Tensor, cache) -> torch.Tensor:
    return model(tokens) if cache is None else model(tokens, cache=cache)


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return F.log_softmax(logits.float() / temperature, dim=-1)


def choose_next(
    logits: torch.Tensor,
    temperature: float,
    topk: int,
    topp: float,
    generator: Optional[torch.Generator],
    greedy: bool,
    padding_idx: Optional[int] = None,
) -> torch.Tensor:
    """Pick one token id (a 0-d LongTensor) from next-token ``logits`` [V]."""
    logits = logits.float().clone()
    if padding_idx is not None:
        logits[padding_idx] = -float("inf")
    if greedy:
        return logits.argmax()
    lprobs = F.log_softmax(logits / temperature, dim=-1)
    indices = None
    if topp > 0:
        probs, indices = _top_p(lprobs.exp(), topp)
    elif topk > 0:
        lprobs, indices = lprobs.topk(min(topk, lprobs.numel()))
        probs = lprobs.exp()
    else:
        probs = lprobs.exp()
    choice = torch.multinomial(probs, 1, generator=generator)[0]
    return choice if indices is None else indices[choice]


def _top_p(probs: torch.Tensor, topp: float):
    """The most likely tokens until their cumulative probability reaches
    ``topp`` (the token that crosses it included, as fairseq does)."""
    sorted_probs, indices = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep = int(mass_before.lt(topp).sum().clamp(min=1))
    return sorted_probs[:keep], indices[:keep]


def _check_sampling_args(prompt_ids, max_len, temperature, topk, topp, max_positions) -> None:
    if prompt_ids.dim() != 1 or prompt_ids.numel() == 0:
        raise ShardtrainError(
            f"The prompt must be a non-empty 1-D tensor of token ids (got shape {tuple(prompt_ids.shape)}); "
            "start it with the end-of-sentence symbol if there is no text, as fairseq does."
        )
    if max_positions is not None and prompt_ids.numel() > max_positions:
        raise ShardtrainError(
            f"The prompt has {prompt_ids.numel()} tokens but the model has only {max_positions} "
            "positions; shorten the prompt."
        )
    checks = [
        (max_len >= 0, f"the maximum length must be >= 0 (got {max_len})"),
        (temperature > 0, f"--temperature must be > 0 (got {temperature}); use greedy decoding instead of 0"),
        (topk >= 0, f"--sampling-topk must be >= 0 (got {topk}); 0 disables it"),
        (0 <= topp <= 1, f"--sampling-topp must be in [0, 1] (got {topp}); 0 disables it"),
    ]
    problems = [message for ok, message in checks if not ok]
    if problems:
        raise ConfigError("Invalid sampling settings: " + "; ".join(problems) + ".")


@torch.no_grad()
def sample_lines(model, context_ids: torch.Tensor, lines: int, eos: int, max_line_len: int = 40,
                 **decoding) -> list:
    """Continue ``context_ids`` (ending with ``eos``, or mid-line) for ``lines`` lines: -> one list of
    token ids per line, without its ``eos``.

    Each line is one :func:`sample` call whose prompt is the text so far, lines separated by ``eos`` as
    the training data has them, cut to the last positions the model has (keeping ``max_line_len`` free
    for the new line): so a model of 128 positions can write many lines that each see the ones before.
    ``decoding``: :func:`sample`'s temperature, topk, topp, generator, greedy, pad."""
    limit = capabilities.max_positions(model)
    keep = None if limit is None else limit - max_line_len  # None: all of the context
    if keep is not None and keep < 1:
        raise ShardtrainError(f"A line of up to {max_line_len} tokens leaves no room for context in the model's "
                              f"{limit} positions; sample shorter lines.")
    context, out = context_ids, []
    for _ in range(lines):
        new = sample(model, context if keep is None else context[-keep:], max_line_len, eos=eos, **decoding)
        line = new[:-1] if new.numel() and new[-1].item() == eos else new
        out.append(line.tolist())
        context = torch.cat([context, line, context.new_tensor([eos])])
    return out
