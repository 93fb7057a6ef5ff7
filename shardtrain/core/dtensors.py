"""Asking whether a tensor is a DTensor without importing DTensor.

``import torch.distributed.tensor`` costs about 1 s of every process's start
(it pulls sympy through torch.fx's symbolic shapes), and the optimizers and
savers only ask ``isinstance(t, DTensor)``. A DTensor can exist only once its
module is imported (FSDP2, DCP and ZeRO import it themselves), so a process
that never imported it holds none: the answer is False without the import.
This keeps ``shard-train``'s refusals, ``shard-preprocess`` and the
``pytorch_ddp`` and one-process runs from paying for sharding they do not use.
"""
import sys

import torch

_MODULE = "torch.distributed.tensor"


def is_dtensor(t) -> bool:
    """``isinstance(t, DTensor)``, without importing DTensor where none can exist."""
    module = sys.modules.get(_MODULE)
    return module is not None and isinstance(t, module.DTensor)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (under no_grad ``to_local`` returns the shard itself, so
    writing into it writes into the DTensor), else ``t``."""
    return t.to_local() if is_dtensor(t) else t
