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
