"""Each rank's random-number generators: saved per rank, restored per rank,
re-seeded when a checkpoint has none for the rank.

Ranks draw different random numbers (dropout over batches of different
shapes), so an exact resume needs every rank's own generators back: the CPU
generator, Python's ``random`` and the generator of the rank's own GPU (never
every visible GPU's: the other ranks own those, and a resumed process may see
fewer). Checkpoints hold them as ``rng_per_rank``, rank r's at index r,
gathered to rank 0 at every save. When a checkpoint has no entry for this world
size (it was saved by another number of ranks, or it predates per-rank states),
every rank is re-seeded from the seed, the update and its rank: deterministic,
but not the stream an uninterrupted run would have drawn.
"""
import hashlib
import logging
import random
from typing import Dict, List, Optional

import torch

from shardtrain.trainer.launch.ranks import gather_to_rank0, rank, world_size

logger = logging.getLogger(__name__)


def rng_state() -> Dict:
    """This rank's generators; its GPU's only when this process uses one."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    device = _own_cuda_device()
    if device is not None:
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))
    if "cuda" in state:
        _set_cuda_state(state["cuda"])


def gather_rng_states() -> Optional[List[Dict]]:
    """Every rank's :func:`rng_state`, on rank 0 (None elsewhere). A collective:
    every rank calls it at every save, whichever rank writes."""
    return gather_to_rank0(rng_state())


def rng_for_this_rank(checkpoint: Dict) -> Optional[Dict]:
    """This rank's saved generators when this many ranks saved ``checkpoint``, else None."""
    saved = checkpoint.get("rng_per_rank") or []
    return saved[rank()] if len(saved) == world_size() else None


def reseed_for_resume(saved: Optional[List[Dict]], num_updates: int, seed: int) -> None:
    """For a rank :func:`rng_for_this_rank` has nothing for (``saved``: the checkpoint's
    rng_per_rank): re-seed, and say so once."""
    saved = len(saved or [])
    reseed(seed, num_updates, for_rank=rank())
    if rank() == 0:  # every rank takes the same branch; one line is enough
        why = (f"it was saved by {saved} rank(s) and this run has {world_size()}" if saved else
               "it holds no per-rank random-number states (it predates them)")
        logger.warning(f"random-number generators re-seeded from --seed {seed}, update {num_updates} and each "
                       f"rank: {why}. Dropout draws differ from an uninterrupted run, so this resume is not bit "
                       "for bit (it is still deterministic).")


def reseed(seed: int, num_updates: int, for_rank: int) -> None:
    """Seed this rank's generators from (seed, update, rank): a stream of its own per rank."""
    # hashed, not summed: seed 1 on rank 1 must not replay seed 2 on rank 0
    digest = hashlib.sha256(f"{seed}/{num_updates}/{for_rank}".encode()).digest()
    value = int.from_bytes(digest[:8], "little") >> 1  # 63 bits: a valid seed for torch and Python alike
    torch.default_generator.manual_seed(value)
    random.seed(value)
    device = _own_cuda_device()
    if device is not None:
        torch.cuda.default_generators[device].manual_seed(value)


def _set_cuda_state(saved) -> None:
    device = _own_cuda_device()
    if isinstance(saved, (list, tuple)):  # older checkpoints: every GPU the saving process saw
        saved = saved[device] if device is not None and device < len(saved) else None
    if device is None or saved is None:
        logger.info(f"the checkpoint's GPU random-number state is skipped: this process "
                    f"{'uses no GPU' if device is None else f'has none saved for cuda:{device}'}")
        return
    torch.cuda.set_rng_state(saved, device)


def _own_cuda_device() -> Optional[int]:
    """The rank's GPU (launch makes it the current device), or None when this process
    has not used CUDA (a CPU run: no GPU generator was drawn from)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return None


def _as_tuple(value):
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value
