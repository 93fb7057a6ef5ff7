"""Rotary position embeddings (Su et al. 2021) in Hugging Face's rotate-half layout, with Llama 3's frequency
scaling: HF's q/k weights load with no permutation (Meta's original checkpoints interleave the pairs instead;
HF's conversion permutes them into this layout). Frequencies, angles, cos and sin are computed in fp32 and cast
to the activations' dtype at the end, as transformers does."""
import math
from typing import Optional, Tuple

import torch


def inverse_frequencies(head_dim: int, theta: float, factor: Optional[float] = None, low_freq_factor: float = 1.0,
                        high_freq_factor: float = 4.0, original_max_positions: int = 8192,
                        device=None) -> torch.Tensor:
    """[head_dim / 2] fp32: theta ** (-2i / head_dim), then, with ``factor``, Llama 3's scaling: wavelengths
    longer than original/low_freq_factor divided by ``factor``, shorter than original/high_freq_factor kept,
    those between blended smoothly (Meta's llama3 apply_scaling; transformers' rope_type "llama3")."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    if factor is None:
        return inv_freq
    low_wavelen = original_max_positions / low_freq_factor
    high_wavelen = original_max_positions / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    between = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(between, blended, scaled)


def cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [..., T, head_dim] of ``positions`` ([T] or [B, T]), each frequency's angle written twice
    (the halves a rotate-half rotation pairs)."""
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [..., T, head_dim / 2]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` [B, H, T, D] rotated; cos/sin [T, D] or [B, T, D] (a head dimension is added)."""
    if cos.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin
