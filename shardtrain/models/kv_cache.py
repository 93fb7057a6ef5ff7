"""The keys and values a decoder's blocks have seen, for generating one token at a time (every family's)."""
from typing import List, Optional, Tuple

import torch


class LayerKVCache:
    """Keys and values [B, H, S, D] of the positions one block has seen."""

    def __init__(self):
        self.k: Optional[torch.Tensor] = None
        self.v: Optional[torch.Tensor] = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.size(2)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys/values after the old ones; return all of them."""
        if self.k is not None:
            k = torch.cat([self.k, k], dim=2)
            v = torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v


class KVCache:
    """One :class:`LayerKVCache` per block; pass it to the model's forward to
    decode incrementally (prefill with the prompt, then feed new tokens)."""

    def __init__(self, num_layers: int):
        self.layers: List[LayerKVCache] = [LayerKVCache() for _ in range(num_layers)]

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0
