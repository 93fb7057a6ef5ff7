"""Planning a run of many ranks at the cost of a few: the FSDP trace runs on at most TRACE_RANKS fake
ranks, and what one rank holds is scaled to the run's ranks from the parameters' shapes.

Why: FSDP2 sets up and reduces every parameter's shards with a Python loop over the ranks (one empty
tensor per rank beyond the parameter's rows), so a trace on 16,384 fake ranks took minutes per
configuration and shard-plan never answered. What depends on the ranks is known exactly: FSDP2 splits
each parameter along its first dimension into ceil(rows / ranks) rows per rank (padded alike), so a
rank holds S(n) = sum of ceil(rows / n) * row size elements of parameters, gradients and optimizer
state, and gathers n * S(n) (the padded whole) for each unit it runs. The trace's kinds are scaled by
those ratios; activations, buffers and temporaries do not depend on the ranks and are kept.
Up to TRACE_RANKS the trace is the run's own (exact); beyond it, scaled (tests/plan/test_plan_world_size.py
compares the two).
"""
import math
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from shardtrain.core.errors import ConfigError
from shardtrain.trainer.memory.rank_memory import GATHERED_KINDS  # the padded whole of a unit
from shardtrain.trainer.parallel.choose import backend_class

# 64 fake ranks trace in about the time of 8 (the per-rank loop is cheap at that size) and leave the
# trace exact for runs of up to 8 nodes of 8 GPUs. Beyond, two traces (32 and 64 ranks) are fitted,
# whatever the ranks: measured here, 1.4-1.7 CPU s for one trace on 8 ranks, 3.0-4.1 for 1,024 or
# 16,384 ranks (before: one trace on 16,384 took minutes).
TRACE_RANKS = 64
SHARDED_KINDS = ("params", "grads", "optimizer")  # one shard of each parameter per rank


class TraceSizes(NamedTuple):
    world: int  # fake ranks the trace runs on
    group: Optional[int]  # --shard-group-size the trace's mesh uses
    traced_shards: int  # ranks a parameter is split over in the trace
    shards: int  # ... and in the run


def trace_sizes(distributed, world_size: int, ranks_per_node: int) -> List[TraceSizes]:
    """The fake worlds (and shard groups) to trace a fully_sharded run of ``world_size`` ranks,
    ``ranks_per_node`` a node, on: its own, up to TRACE_RANKS; else two of at most TRACE_RANKS, from which
    ``combine`` scales. The ranks a parameter is split over are the backend's own fact
    (``parameter_shards``: a hybrid strategy's group is --shard-group-size, else a node's ranks), and a
    hybrid trace's mesh is given that group: the fake ranks are no node's, so the mesh would otherwise group
    them all."""
    strategy, requested = distributed.fsdp_sharding_strategy, distributed.shard_group_size
    shards = backend_class(distributed.ddp_backend).parameter_shards(distributed, world_size, ranks_per_node)
    hybrid = strategy not in ("full_shard", "shard_grad_op", "no_shard")
    group = shards if hybrid else requested
    if world_size <= TRACE_RANKS:
        return [TraceSizes(world_size, group, shards, shards)]
    if shards < 1 or world_size % shards:
        raise ConfigError(f"--fsdp-sharding-strategy {strategy} shards within groups of --shard-group-size {shards} "
                          f"ranks, which does not divide the world size {world_size}. Choose a group size that "
                          f"divides {world_size}, or change --distributed-world-size.")
    if shards <= TRACE_RANKS:  # only the replicas are many: one trace with the run's groups is exact
        return [TraceSizes((TRACE_RANKS // shards) * shards, shards, shards, shards)]
    return [TraceSizes(n, n, n, shards) for n in (TRACE_RANKS // 2, TRACE_RANKS)]


def shard_rows(model: torch.nn.Module) -> List[Tuple[int, int]]:
    """(rows, elements per row) of each parameter: FSDP2 shards the first dimension."""
    out = []
    for p in model.parameters():
        rows = p.shape[0] if p.dim() > 0 else 1
        out.append((rows, p.numel() // rows if rows else 0))
    return out


def per_rank_elements(rows: List[Tuple[int, int]], shards: int) -> int:
    """S(n): the parameter elements one rank holds (the first rank's, the fullest) on ``shards`` ranks."""
    return sum(math.ceil(r / shards) * size for r, size in rows)


def combine(traced: List[Tuple[TraceSizes, Dict[str, int]]], rows: List[Tuple[int, int]]) -> Dict[str, int]:
    """One rank of the run, from the trace(s) ``trace_sizes`` asked for: the run's own is returned as it
    is; from two smaller ones, what one shard holds is fitted as a + b * S(n) (the optimizer's kind also
    holds state that does not shrink with the ranks: steps, and what the tracker counts during the
    step) and the gathered wholes are scaled by n * S(n); the rest is the larger trace's."""
    (small, k1), (large, k2) = traced[0], traced[-1]
    if large.traced_shards == large.shards:
        return k2
    s1, s2 = per_rank_elements(rows, small.traced_shards), per_rank_elements(rows, large.traced_shards)
    run = per_rank_elements(rows, large.shards)
    out = dict(k2)
    for kind in SHARDED_KINDS:
        slope = (k1[kind] - k2[kind]) / (s1 - s2) if s1 != s2 else (k2[kind] / s2 if s2 else 0.0)
        out[kind] = max(0, round(k2[kind] + slope * (run - s2)))
    for kind in GATHERED_KINDS:
        out[kind] = round(k2[kind] * large.shards * run / (large.traced_shards * s2)) if s2 else k2[kind]
    return out
