"""Small helpers shared by models."""
from typing import Tuple

import torch.nn as nn


def num_parameters(model: nn.Module) -> Tuple[int, int]:
    """``(total, trainable)`` parameter counts; shared parameters count once.

    Works on meta-device models and on sharded (DTensor) parameters, whose
    ``numel()`` is the global size.
    """
    total = trainable = 0
    for param in model.parameters():
        total += param.numel()
        if param.requires_grad:
            trainable += param.numel()
    return total, trainable
