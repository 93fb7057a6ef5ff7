"""Merge LM samples into a right-padded batch, as fairseq's ``MonolingualDataset``."""
from typing import List, Sequence

import torch
from torch.nn.utils.rnn import pad_sequence


def _pad_right(tensors: Sequence[torch.Tensor], pad: int) -> torch.Tensor:
    return pad_sequence([t.long() for t in tensors], batch_first=True, padding_value=pad)


def collate(samples: List[dict], pad: int) -> dict:
    """Batch ``{"id", "source", "target"}`` samples.

    Returns ``{}`` for no samples: that is the filler batch a short data
    shard gets so that every rank runs the same number of steps.
    ``ntokens`` counts the real (non-pad) target tokens; as in fairseq it is
    the sum of the sample lengths, because source and target have equal
    lengths. A sample whose target is None is its own target (fairseq's
    ``targets=None``).
    """
    if len(samples) == 0:
        return {}
    src_tokens = _pad_right([s["source"] for s in samples], pad)
    if samples[0]["target"] is None:
        target = src_tokens
    else:
        target = _pad_right([s["target"] for s in samples], pad)
    lengths = [len(s["source"]) for s in samples]
    return {
        "id": torch.tensor([int(s["id"]) for s in samples], dtype=torch.long),
        "nsentences": len(samples),
        "ntokens": sum(lengths),
        "net_input": {
            "src_tokens": src_tokens,
            "src_lengths": torch.tensor(lengths, dtype=torch.long),
        },
        "target": target,
    }


def document_ids(src_tokens: torch.Tensor, eos: int) -> torch.Tensor:
    """[B, T]: which document of its row each source token is in (``--attn-mask-type block_causal``).

    A document starts at each ``eos``: a source block is its target shifted right by one, so the ``</s>`` that
    ends a line stands before the next line, as its start token (the one a sample of ``--sample-break-mode eos``
    begins with). Each line is then computed exactly as that one-line sample would be. The tokens before a row's
    first ``eos`` (a line cut at the row's start) are document 0. Right padding continues the last document;
    its targets are pad and ignored.
    """
    return torch.cumsum(src_tokens == eos, dim=1)
