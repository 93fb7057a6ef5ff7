"""Beam search for a language model continuing a prompt, scored as fairseq's ``SequenceGenerator``.

Each step extends every live hypothesis by every token and keeps the ``2 * beam`` best by summed
log-probability; a candidate ending in end-of-sentence among the best ``beam`` is finished, with the
score ``sum / length ** lenpen`` (length: its tokens, prompt and end-of-sentence included), and the
first ``beam`` others live on. The search ends once ``beam`` hypotheses are finished, or at the
length limit, where every live one is finished with end-of-sentence. One deliberate difference:
fairseq forces the prompt into all beams alike and then expands each copy, so it may return the
same continuation several times; here the first free step expands one copy only, as fairseq does
for an empty prompt. The whole prefix is recomputed at each step (no cache): fine for the short
continuations of a CLI.
"""
import math
from typing import Callable, List, NamedTuple, Optional

import torch
import torch.nn.functional as F

from shardtrain.core.errors import ConfigError
from shardtrain.models import capabilities


class Finished(NamedTuple):
    new_tokens: List[int]  # after the prompt, ending with end-of-sentence
    scores: List[float]  # log-prob (base e) of each prompt token after the first, then of each new token
    score: float  # sum(scores) / len(scores) ** lenpen


@torch.no_grad()
def beam_search(model, prompt_ids: torch.Tensor, beam: int, max_len: int, eos: int,
                lenpen: float = 1.0, on_step: Optional[Callable[[], None]] = None,
                pad: Optional[int] = None) -> List[Finished]:
    """The ``beam`` best continuations of ``prompt_ids`` [T] (``prompt_ids[0]`` the end-of-sentence
    it starts after), at most ``max_len`` new tokens before the end-of-sentence; best first.
    ``on_step`` is called once per step (a progress bar's update); ``pad``: the dictionary's padding
    symbol, never produced (for a model without ``padding_idx``)."""
    if beam < 1 or max_len < 0:
        raise ConfigError(f"beam search needs --beam >= 1 and --max-len >= 0 (got {beam} and {max_len}).")
    budget = capabilities.room_after(model, prompt_ids.numel(), max_len)
    pad = capabilities.padding_idx(model, pad)
    was_training = model.training
    model.eval()
    try:
        lprobs = _log_probs(model, prompt_ids.view(1, -1), pad)[0]
        prompt_scores = lprobs[:-1].gather(1, prompt_ids[1:].view(-1, 1)).view(-1).tolist()
        tokens, summed, steps = prompt_ids.view(1, -1), lprobs.new_zeros(1), [[]]
        last, finished = lprobs[-1:], []
        for step in range(budget + 1):
            if on_step is not None:
                on_step()
            if step == budget:  # the length limit: every live hypothesis ends here
                for b in range(len(steps)):
                    _finish(finished, tokens[b], steps[b] + [float(last[b, eos])], prompt_scores, lenpen, eos)
                break
            candidates = (summed.unsqueeze(1) + last).view(-1)
            top = candidates.topk(min(2 * beam, candidates.numel()))
            keep = []
            for rank, (value, flat) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                b, token = divmod(flat, last.size(1))
                if value == -math.inf:
                    break
                if token == eos:
                    if rank < beam:
                        _finish(finished, tokens[b], steps[b] + [float(last[b, eos])], prompt_scores, lenpen, eos)
                elif len(keep) < beam:
                    keep.append((b, token, value))
            if len(finished) >= beam or not keep:
                break
            rows = torch.tensor([b for b, _, _ in keep], device=tokens.device)
            new = torch.tensor([t for _, t, _ in keep], device=tokens.device).view(-1, 1)
            steps = [steps[b] + [float(last[b, t])] for b, t, _ in keep]
            tokens = torch.cat([tokens[rows], new], dim=1)
            summed = torch.tensor([v for _, _, v in keep], device=tokens.device)
            last = _log_probs(model, tokens, pad)[:, -1]
    finally:
        model.train(was_training)
    return sorted(finished, key=lambda f: -f.score)[:beam]


def _log_probs(model, tokens: torch.Tensor, pad: Optional[int]) -> torch.Tensor:
    lprobs = F.log_softmax(model(tokens).float(), dim=-1)
    if pad is not None:
        lprobs[..., pad] = -math.inf  # never chosen, as in fairseq
    return lprobs


def _finish(finished: list, row: torch.Tensor, new_scores: List[float], prompt_scores: List[float],
            lenpen: float, eos: int) -> None:
    new_tokens = row[len(prompt_scores) + 1:].tolist() + [eos]
    scores = prompt_scores + new_scores
    finished.append(Finished(new_tokens, scores, sum(scores) / len(scores) ** lenpen))
