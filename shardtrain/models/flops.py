"""FLOPs a decoder spends per trained token, for the records' mfu (shardtrain.trainer.metrics.flops)."""


def decoder_flops_per_token(weights: int, layers: int, width: int, seq_len: int) -> float:
    """PaLM's count (Chowdhery et al. 2022, appendix B): 6 FLOPs per weight a token is multiplied
    by (2 in forward, 4 in backward), plus 12 x layers x width x seq_len for the attention scores
    and the weighted sum of the values over the whole sequence (the half the causal mask skips
    included, as PaLM and torch's FLOP counter count it). Norms, activations and the softmax,
    a few FLOPs per value rather than per weight, are left out."""
    return 6.0 * weights + 12.0 * layers * width * seq_len
