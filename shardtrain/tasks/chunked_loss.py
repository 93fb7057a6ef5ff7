"""The output projection and the loss, chunk by chunk: the logits of the whole batch never exist, in forward or
in backward (``--loss-chunks``; tests/tasks/test_chunked_loss.py).

``chunked_loss(features [N, D], weight [V, D], target [N], ...) -> (loss, nll)``: the summed losses of
criterions.py's ``cross_entropy`` and ``label_smoothed_cross_entropy`` (fairseq's formula: eps_i = eps / (V - 1),
loss = (1 - eps - eps_i) * nll + eps_i * smooth), equal to their unchunked values within 1e-6 relative in fp32.
Forward projects one chunk of rows at a time in the same dtypes as the unchunked loss (the projection in the
features' dtype, then fp32 for the log-softmax) and keeps each row's logsumexp (N floats); backward projects each
chunk again, forms its fp32 logit gradient (softmax minus the smoothed one-hot, zero for ignored targets),
multiplies it by the incoming gradient (fp16's loss scale: torchtitan's chunked loss drops it), and accumulates
the features' gradient chunk by chunk and the weight's in fp32.

Which batches are chunked (``--loss-chunks 0``, the default): those whose fp32 logits would exceed
LOGITS_BUDGET, in as few chunks as keep each chunk's logits within it. Chunking costs one more projection per
chunk in backward, a third more of the output projection's FLOPs (2 N V D more on top of 6 N V D); below the
budget the logits are small next to a model's activations and that time buys little memory, and chunks close to
the budget (up to 523 rows at vocabulary 128,256) keep each matmul large enough to run at full speed.
"""
import contextlib
from typing import List, Tuple

import torch
import torch.nn.functional as F

from shardtrain.core.errors import ConfigError

LOGITS_BUDGET = 256 * 2 ** 20  # bytes of fp32 logits a batch (or one chunk) may hold before it is chunked
FLAG = "--loss-chunks"


def check_requested(requested: int) -> None:
    if requested < 0:
        raise ConfigError(f"{FLAG} {requested} is not a chunk count: use 0 (shardtrain chooses), 1 (the whole "
                          "batch's logits at once) or more (that many chunks of the output projection).")


def chunk_count(requested: int, tokens: int, vocab: int, chunkable: bool) -> int:
    """How many chunks a batch of ``tokens`` rows (padding included) over ``vocab`` is projected in (1: not
    chunked): ``requested``, or for 0 the rule above (1 where the model cannot be chunked)."""
    if requested == 0 and not chunkable:
        return 1
    if requested == 0:
        rows = max(1, LOGITS_BUDGET // (4 * vocab))
        return max(1, -(-tokens // rows))
    if requested > 1 and not chunkable:
        raise ConfigError(
            f"{FLAG} {requested} projects the logits chunk by chunk, which this run cannot: the model must take "
            "forward(..., features_only=True) and have an output_weight() (an adaptive softmax has none), and "
            "--find-unused-parameters must be off (DDP would mark the output weight, used after forward, unused). "
            f"Use {FLAG} 1, or {FLAG} 0 to chunk where the model allows.")
    # A batch shorter than the chunks asked for (an epoch's last, a validation batch) gets a chunk per token: the
    # count was held against the run's largest batch before it started (check_largest_batch).
    return min(requested, max(1, tokens))


def check_largest_batch(requested: int, tokens: int) -> None:
    """Refuse, before a run starts, more chunks than its largest batch (``tokens``, padding included) has rows."""
    if requested > tokens:
        raise ConfigError(
            f"{FLAG} {requested} splits a batch's tokens into {requested} chunks, but this run's batches hold at "
            f"most {tokens} tokens (--batch-size x --tokens-per-sample, or --max-tokens). Use {FLAG} {tokens} or "
            f"fewer, or {FLAG} 0 to let shardtrain choose (it chunks only batches whose fp32 logits exceed "
            f"{LOGITS_BUDGET // 2 ** 20} MiB).")


def chunked_loss(features: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *, chunks: int,
                 ignore_index: int, label_smoothing: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(summed loss, summed nll) of ``F.linear(features, weight)`` against ``target``, in ``chunks`` chunks of
    rows; rows whose target is ``ignore_index`` count nothing. Under autocast both inputs are cast to its dtype
    first, as autocast casts F.linear's, so the chunks compute as the unchunked projection does."""
    device = features.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        features, weight = features.to(dtype), weight.to(dtype)
    with _no_autocast(device):
        return _ChunkedLoss.apply(features, weight, target, chunks, ignore_index, float(label_smoothing))


def _no_autocast(device: str):
    """The chunks' dtypes are set by chunked_loss, in forward and in backward alike."""
    if torch.amp.is_autocast_available(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


def _bounds(rows: int, chunks: int) -> List[Tuple[int, int]]:
    """``chunks`` row ranges covering ``rows``, sizes within one of each other."""
    edges = [i * rows // chunks for i in range(chunks + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _weights(eps: float, vocab: int) -> Tuple[float, float]:
    """fairseq's label smoothing: (eps_i, the weight of the nll)."""
    eps_i = eps / (vocab - 1)
    return eps_i, 1.0 - eps - eps_i


class _ChunkedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, weight, target, chunks, ignore_index, eps):
        eps_i, on_target = _weights(eps, weight.size(0))
        nll = features.new_zeros((), dtype=torch.float32)
        smooth = features.new_zeros((), dtype=torch.float32)
        lse = features.new_empty(features.size(0), dtype=torch.float32)
        for start, end in _bounds(features.size(0), chunks):
            logits = F.linear(features[start:end], weight).float()  # the unchunked loss's dtypes
            lse[start:end] = row_lse = torch.logsumexp(logits, dim=-1)
            t = target[start:end]
            ignored = t.eq(ignore_index)
            nll = nll + (row_lse - logits.gather(1, t[:, None]).squeeze(1)).masked_fill(ignored, 0.0).sum()
            if eps:
                # sum over the vocabulary of -log p: (lse - logit) summed, as -log_softmax(...).sum() is
                smooth = smooth + (row_lse[:, None] - logits).sum(-1).masked_fill(ignored, 0.0).sum()
            del logits  # before the next chunk's are made: one chunk alive at a time
        ctx.save_for_backward(features, weight, target, lse)
        ctx.chunks, ctx.ignore_index, ctx.eps = chunks, ignore_index, eps
        ctx.mark_non_differentiable(nll)
        return on_target * nll + eps_i * smooth, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        features, weight, target, lse = ctx.saved_tensors
        need_features, need_weight = ctx.needs_input_grad[:2]
        eps_i, on_target = _weights(ctx.eps, weight.size(0))
        grad_features = torch.empty_like(features) if need_features else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        with _no_autocast(features.device.type):
            for start, end in _bounds(features.size(0), ctx.chunks):
                f, t = features[start:end], target[start:end]
                grad = F.linear(f, weight).float().sub_(lse[start:end, None]).exp_()  # softmax, in place
                # d loss / d logit = p - (on_target one-hot + eps_i): the smoothed target sums to one
                if eps_i:
                    grad.sub_(eps_i)
                grad.scatter_add_(1, t[:, None], grad.new_full((end - start, 1), -on_target))
                grad.masked_fill_(t.eq(ctx.ignore_index)[:, None], 0.0)
                grad = grad.mul_(grad_loss).to(features.dtype)  # the incoming gradient: fp16's loss scale
                if need_features:
                    grad_features[start:end] = grad @ weight
                if need_weight and grad.dtype == grad_weight.dtype:
                    grad_weight.addmm_(grad.t(), f)  # no [V, D] temporary
                elif need_weight:
                    grad_weight += grad.t() @ f  # added into the fp32 sum as it is read: no fp32 copy of it
                del grad  # before the next chunk's logits are made
        return grad_features, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None, None
