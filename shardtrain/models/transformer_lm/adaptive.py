"""Adaptive input (Baevski & Auli, 2019) and adaptive softmax (Grave et al., 2017),
as fairseq 0.12's ``AdaptiveInput``/``AdaptiveSoftmax`` define them.

The vocabulary is split into bands at ``cutoff`` (ids below cutoff[0] are the
frequent *head*); band ``i`` gets an embedding of ``dim // factor**i``
dimensions. The softmax predicts the head words plus one *cluster* logit per
tail band, then the word inside a tail band from a smaller projection:
``log p(w) = log p_head(cluster(w)) + log p_band(w | cluster)``.

Tied weights (``--tie-adaptive-weights``/``--tie-adaptive-proj``) are read
from the :class:`AdaptiveInput` at forward time rather than held as a second
reference to the same ``nn.Parameter``: ``to_empty`` and FSDP2 re-create
parameters per module and would silently untie them (the same reason the model
applies shared embeddings as ``F.linear(x, embed_tokens.weight)``).

Every band and every tail cluster runs on every forward, on an empty
selection when no token of the batch falls in it, so each parameter gets a
(zero) gradient and DDP needs no ``find_unused_parameters``.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from shardtrain.core.errors import ConfigError
from shardtrain.models.init import init_, zero_row_


def parse_cutoff(text: str, flag: str, vocab_size: int) -> List[int]:
    """``"20000,60000"`` -> ``[20000, 60000, vocab_size]`` (fairseq appends the vocabulary size)."""
    try:
        cutoff = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not a comma separated list of integers; "
                          "write it like 20000,60000.") from None
    if not cutoff or any(b <= a for a, b in zip([0] + cutoff, cutoff)):
        raise ConfigError(f"{flag} {text!r} must be positive, strictly increasing band ends "
                          "(like 20000,60000).")
    if cutoff[-1] > vocab_size:
        raise ConfigError(
            f"{flag} {text!r} reaches past the dictionary's {vocab_size} symbols: every cutoff must be "
            f"below the vocabulary size (only the last may equal it). Lower the cutoffs for this "
            "dictionary, e.g. with a tiny vocabulary override the preset's 20000,60000."
        )
    return cutoff if cutoff[-1] == vocab_size else cutoff + [vocab_size]


def band_dim(dim: int, factor: float, band: int) -> int:
    """fairseq's ``int(dim // factor ** band)``; refused when it reaches zero."""
    size = int(dim // factor ** band)
    if size < 1:
        raise ConfigError(f"adaptive band {band} would have {dim} // {factor}**{band} = 0 dimensions; "
                          "use a smaller --adaptive-input-factor/--adaptive-softmax-factor or fewer cutoffs.")
    return size


def _bands(cutoff: Sequence[int]):
    """(start, end) of every band."""
    return list(zip([0] + list(cutoff[:-1]), cutoff))


class AdaptiveInput(nn.Module):
    """Token ids -> [..., output_dim]: band ``i`` is ``Embedding(size_i, dim_i)`` then
    ``Linear(dim_i, output_dim)``. Keys match fairseq's ``embeddings.{i}.{0,1}.weight``."""

    def __init__(self, vocab_size: int, padding_idx: int, initial_dim: int, factor: float,
                 output_dim: int, cutoff: List[int]):
        super().__init__()
        self.cutoff = cutoff
        self.padding_idx = padding_idx
        self.embedding_dim = output_dim
        self.embeddings = nn.ModuleList()
        for band, (start, end) in enumerate(_bands(cutoff)):
            dim = band_dim(initial_dim, factor, band)
            # fairseq gives only the head band a padding index.
            embedding = nn.Embedding(end - start, dim, padding_idx if band == 0 else None)
            self.embeddings.append(nn.Sequential(embedding, nn.Linear(dim, output_dim, bias=False)))

    @torch.no_grad()
    def init_weights(self) -> None:
        for embedding, proj in self.embeddings:
            init_(embedding.weight, nn.init.normal_, mean=0.0, std=embedding.weight.size(1) ** -0.5)
            # fairseq zeroes row ``padding_idx`` of every band's table, not only the head's.
            if self.padding_idx < embedding.weight.size(0):
                zero_row_(embedding.weight, self.padding_idx)
            init_(proj.weight, nn.init.xavier_uniform_)

    def weights_for_band(self, band: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(embedding [size, dim], projection [output_dim, dim]) of one band."""
        embedding, proj = self.embeddings[band]
        return embedding.weight, proj.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        flat = tokens.reshape(-1)
        out = None
        for (start, end), band in zip(_bands(self.cutoff), self.embeddings):
            rows = ((flat >= start) & (flat < end)).nonzero().squeeze(1)
            values = band(flat.index_select(0, rows) - start)
            if out is None:
                out = values.new_zeros(flat.size(0), self.embedding_dim)
            out = out.index_copy(0, rows, values)
        return out.view(*tokens.shape, self.embedding_dim)


class AdaptiveSoftmax(nn.Module):
    """Features [N, input_dim] -> per-cluster logits (training) or full log-probs.

    Untied: ``head`` is ``Linear(input_dim, cutoff[0] + clusters)``, tail ``i`` is
    ``tail_proj[i]: Linear(input_dim, dim_i)`` then ``tail_out[i]: Linear(dim_i, size_i)``
    with ``dim_i = input_dim // factor**(i+1)``. With ``tie_weights`` the head's word
    rows and ``tail_out`` are the adaptive input's band embeddings (only
    ``class_proj``, the cluster rows, is the softmax's own); with ``tie_proj`` too,
    ``tail_proj[i]`` is the transpose of band ``i+1``'s input projection.
    """

    def __init__(self, vocab_size: int, input_dim: int, cutoff: List[int], dropout: float,
                 factor: float, tie_weights: bool = False, tie_proj: bool = False):
        super().__init__()
        self.vocab_size = vocab_size
        self.cutoff = cutoff
        self.clusters = len(cutoff) - 1
        self.tie_weights, self.tie_proj = tie_weights, tie_weights and tie_proj
        self.dropout = nn.Dropout(dropout)
        if tie_weights:
            self.class_proj = nn.Linear(input_dim, self.clusters, bias=False)
        else:
            self.head = nn.Linear(input_dim, cutoff[0] + self.clusters, bias=False)
        tails = _bands(cutoff)[1:]
        dims = [band_dim(input_dim, factor, i + 1) for i in range(self.clusters)]
        self.tail_proj = None if self.tie_proj else nn.ModuleList(
            nn.Linear(input_dim, dim, bias=False) for dim in dims)
        self.tail_out = None if tie_weights else nn.ModuleList(
            nn.Linear(dim, end - start, bias=False) for dim, (start, end) in zip(dims, tails))

    @torch.no_grad()
    def init_weights(self) -> None:
        # fairseq: xavier_uniform on every weight the softmax owns.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                init_(module.weight, nn.init.xavier_uniform_)

    def head_weight(self, adaptive_input: Optional[AdaptiveInput]) -> torch.Tensor:
        if not self.tie_weights:
            return self.head.weight
        return torch.cat([adaptive_input.weights_for_band(0)[0], self.class_proj.weight], dim=0)

    def tail_logits(self, index: int, x: torch.Tensor, adaptive_input: Optional[AdaptiveInput]):
        """Logits over the words of tail band ``index`` (band ``index + 1`` of the input)."""
        if self.tie_weights:
            embedding, proj = adaptive_input.weights_for_band(index + 1)
        proj_weight = proj.t() if self.tie_proj else self.tail_proj[index].weight
        out_weight = embedding if self.tie_weights else self.tail_out[index].weight
        return F.linear(self.dropout(F.linear(x, proj_weight)), out_weight)

    def forward(self, features: torch.Tensor, target: torch.Tensor,
                adaptive_input: Optional[AdaptiveInput] = None):
        """-> (logits, targets): the head's logits over its words and clusters with every
        token's head target, then for each tail band the logits and in-band targets of
        the tokens in it (fairseq's ``AdaptiveSoftmax.forward``; the loss is the sum of
        their cross entropies)."""
        x = self.dropout(features.reshape(-1, features.size(-1)))
        target = target.reshape(-1)
        head_target = target.clone()
        logits, targets = [F.linear(x, self.head_weight(adaptive_input))], [head_target]
        for index, (start, end) in enumerate(_bands(self.cutoff)[1:]):
            rows = ((target >= start) & (target < end)).nonzero().squeeze(1)
            head_target[rows] = self.cutoff[0] + index
            logits.append(self.tail_logits(index, x.index_select(0, rows), adaptive_input))
            targets.append(target.index_select(0, rows) - start)
        return logits, targets

    def get_log_prob(self, features: torch.Tensor,
                     adaptive_input: Optional[AdaptiveInput] = None) -> torch.Tensor:
        """Log-probabilities [..., vocab_size] over the whole vocabulary."""
        x = features.reshape(-1, features.size(-1))
        head = torch.log_softmax(F.linear(x, self.head_weight(adaptive_input)).float(), dim=-1)
        parts = [head[:, : self.cutoff[0]]]
        for index in range(self.clusters):
            tail = torch.log_softmax(self.tail_logits(index, x, adaptive_input).float(), dim=-1)
            parts.append(tail + head[:, self.cutoff[0] + index, None])
        return torch.cat(parts, dim=-1).view(*features.shape[:-1], self.vocab_size)


def adaptive_checks(cfg, input_dim: int, output_dim: int) -> List[Tuple[bool, str]]:
    """(ok, message) pairs for the adaptive flags of a ``transformer_lm`` config."""
    tied = cfg.tie_adaptive_weights
    softmax = cfg.adaptive_softmax_cutoff is not None
    return [
        (not cfg.adaptive_input or cfg.adaptive_input_cutoff is not None,
         "--adaptive-input needs --adaptive-input-cutoff (like 20000,60000)."),
        (not cfg.share_decoder_input_output_embed or not (cfg.adaptive_input or softmax),
         "--share-decoder-input-output-embed cannot share an adaptive input or softmax; "
         "use --tie-adaptive-weights instead."),
        (not tied or (cfg.adaptive_input and softmax),
         "--tie-adaptive-weights needs both --adaptive-input and --adaptive-softmax-cutoff."),
        (not tied or cfg.adaptive_input_factor == cfg.adaptive_softmax_factor,
         f"--tie-adaptive-weights needs --adaptive-input-factor ({cfg.adaptive_input_factor}) equal to "
         f"--adaptive-softmax-factor ({cfg.adaptive_softmax_factor})."),
        (not tied or str(cfg.adaptive_input_cutoff).replace(" ", "")
         == str(cfg.adaptive_softmax_cutoff).replace(" ", ""),
         f"--tie-adaptive-weights needs --adaptive-input-cutoff ({cfg.adaptive_input_cutoff}) equal to "
         f"--adaptive-softmax-cutoff ({cfg.adaptive_softmax_cutoff})."),
        (not tied or input_dim == output_dim == cfg.decoder_embed_dim,
         f"--tie-adaptive-weights needs --decoder-input-dim ({input_dim}) and --decoder-output-dim "
         f"({output_dim}) equal to --decoder-embed-dim ({cfg.decoder_embed_dim}); leave them unset."),
    ]
