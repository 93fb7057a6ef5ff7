"""No checkpoint holds NaN or inf weights or optimizer state.

A run that steps to NaN weights (a damaged checkpoint resumed, an optimizer
moment gone negative) must not overwrite ``checkpoint_last`` with them: the
save is refused, by every rank together, before anything is written. The
check is one fused pass over this rank's local tensors (their norms, see
``all_finite``), then one all-reduce, so every rank's shards count and every
rank refuses alike; it costs about 2% of the save (benchmarks/finite_check.py).
"""
from typing import Dict, Iterator, List, Optional, Tuple

import torch
from torch.nn.utils import get_total_norm

from shardtrain.core.errors import CheckpointError

Named = List[Tuple[str, torch.Tensor]]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's own shard


def _floating(named: Iterator[Tuple[str, torch.Tensor]]) -> Named:
    return [(name, _local(t).detach()) for name, t in named if torch.is_tensor(t) and t.is_floating_point()]


def parameter_tensors(model: torch.nn.Module) -> Named:
    return _floating(model.named_parameters())


def optimizer_tensors(model: torch.nn.Module, optimizer) -> Named:
    """This rank's optimizer state (its shard under ZeRO and FSDP), named ``param.key``."""
    names = {id(p): name for name, p in model.named_parameters()}
    return _floating((f"{names.get(id(p), '?')}.{key}", value)
                     for p, state in optimizer.state.items() for key, value in state.items())


def all_finite(tensors: List[torch.Tensor]) -> bool:
    """True when every element is finite. Fast path: L2 norms (NaN and inf survive a sum of
    squares), fused per device and dtype for fp32 and wider, in fp32 for fp16/bf16 (whose own
    norm overflows at 65504). A norm can also overflow with every element finite (|x| > ~1e19):
    only then is each tensor checked element by element."""
    wide = [t for t in tensors if t.element_size() >= 4]
    norms = [torch.linalg.vector_norm(t, dtype=torch.float32).cpu() for t in tensors if t.element_size() < 4]
    if wide:
        norms.append(get_total_norm(wide, foreach=True).float().cpu())
    if not norms or bool(torch.isfinite(torch.stack(norms)).all()):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def first_nonfinite(named: Named) -> Optional[str]:
    """The name of the first tensor holding NaN/inf (only called once a check failed)."""
    return next((name for name, t in named if not torch.isfinite(t).all()), None)


def check_finite(model, optimizer, backend, updates: int) -> None:
    """Refuse (on every rank) to save update ``updates`` if any rank's parameters or
    optimizer state hold NaN/inf. A collective: every rank calls it before every save."""
    parts: Dict[str, Named] = {"parameters": parameter_tensors(model),
                               "optimizer state": optimizer_tensors(model, optimizer)}
    # one row per part, one column per rank: every rank learns which part is damaged, and where
    flags = torch.zeros(len(parts), backend.world_size, device=backend.device)
    for row, named in enumerate(parts.values()):
        flags[row, backend.rank] = 0.0 if all_finite([t for _, t in named]) else 1.0
    flags = backend.all_reduce_sum(flags).cpu()
    bad = [kind for kind, row in zip(parts, flags) if row.any()]
    if not bad:
        return
    rank = int(flags[list(parts).index(bad[0])].nonzero()[0])
    name = f": {first_nonfinite(parts[bad[0]])!r}" if rank == backend.rank else ""
    example = f" (first on rank {rank}{name})"
    raise CheckpointError(
        f"Not saving the checkpoint of update {updates}: the model's {' and '.join(bad)} hold NaN or inf"
        f"{example}, and saving would overwrite good checkpoints with them. Nothing was written; the checkpoints "
        "already in --save-dir are as they were. If this run resumed from a checkpoint, that checkpoint may be "
        "damaged: resume from an older one (--restore-file). Otherwise the training diverged: lower --lr, add "
        "warmup (--warmup-updates) or set --clip-norm.")
