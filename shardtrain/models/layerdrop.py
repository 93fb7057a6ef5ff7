"""LayerDrop (Fan et al., 2019; fairseq's ``--decoder-layerdrop``): while training,
skip each whole block with probability ``p``; at evaluation run them all.

A dropped block runs on an empty slice of the sequence (see the model's
forward): no compute, but its parameters take part, with zero gradients, so DDP
needs no ``find_unused_parameters`` and FSDP2 gathers and reduces every block on
every rank. The draws come from a generator of their own, seeded alike on every
rank and advanced once per training forward, so all data-parallel ranks drop the
same blocks: each update trains one sub-network, as in one process. The global
RNG is not used because ranks seed it differently (dropout masks must differ).
"""
from typing import List

import torch

#: the seed of the skip draws (the same on every rank)
LAYERDROP_SEED = 0x5EED


class LayerDrop:
    """Decides which blocks run; holds its generator state for checkpoints."""

    def __init__(self, p: float, seed: int = LAYERDROP_SEED):
        self.p = p
        self.generator = torch.Generator().manual_seed(seed)

    def keep(self, num_blocks: int, training: bool) -> List[bool]:
        if not training or self.p <= 0.0:
            return [True] * num_blocks
        draws = torch.rand(num_blocks, generator=self.generator)
        # fairseq runs a layer when its uniform draw exceeds p.
        return (draws > self.p).tolist()

    def state_dict(self):
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state) -> None:
        self.generator.set_state(state["generator"])
