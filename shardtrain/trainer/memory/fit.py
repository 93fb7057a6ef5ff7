"""Refuse, before anything is allocated, a model whose state cannot fit this machine.

``--decoder-layers 100000`` used to build for minutes and then fail with an
allocation traceback; ``--tokens-per-sample 1000000000`` tried to allocate
128 GB of positions. The estimate is shard-plan's (rank_memory.py, the one estimator): this rank's
parameters, gradients and optimizer state (divided over the ranks where the
backend shards them), the backend's gradient copies and buffers (the sinusoidal
positions), counted from the model built on the meta device (no memory; deep
models from one and two layers: model_sizes.py) rather than traced, and placed
as shard-plan places them. The activations are what autograd keeps from the
model's forward of one sequence of --tokens-per-sample tokens (a lower bound of
the batch's: the loss's own are not counted, nor dropout's masks).
--spike-rollback's snapshot is a copy of the parameters, buffers and optimizer state, each beside
what it copies. --async-save keeps a pinned host copy of the state each rank holds on its GPU for the
whole run (rank_memory.staged_bytes): without it counted, a run passed this check and ran out of host
memory at its first save. The CPU step during backward keeps a copy of each shard's parameter and moments where the
update may be undone (rank_memory.undo_copy_bytes), and --cpu-offload's pinned shards are rounded up to powers of
two (pinned.py): a 6.7B model with --clip-norm needed about 178 GiB where this check said 99 and let it start; the
refusal names --cpu-step after-backward first where that alone makes it fit. The host's free memory is
MemAvailable, or less under a cgroup limit (host_memory.py).
Only what certainly cannot fit is refused: the activations of one sequence only,
none under --checkpoint-activations, and an optimizer whose spec does not say its
state bytes (OptimizerSpec.state_bytes) counts none.
"""
import logging
from typing import Dict, Optional

import torch

from shardtrain.core.errors import ConfigError
from shardtrain.trainer.memory.host_memory import host_memory
from shardtrain.trainer.run_facts import RunFacts
from shardtrain.trainer.memory.model_sizes import model_sizes
from shardtrain.trainer.memory.pinned import pinned_rounding
from shardtrain.trainer.memory.rank_memory import RankMemory, counted_kinds, rank_memory
from shardtrain.trainer.resolved import Components

logger = logging.getLogger(__name__)
GIB = 2 ** 30
# Host bytes per parameter tensor beyond its data, measured on the CPU with torch 2.13 (3,000 blocks
# of transformer_lm): 2.9 KB building the module, 0.4 KB its gradient, 2.6 KB Adam's two moments.
# 100,000 small blocks hold 1.2M parameter tensors: 7 GB of it, more than their numbers.
BYTES_PER_TENSOR = 5 * 1024


def estimate(cfg, components: Components, task, facts: RunFacts, device_type: str, activations: bool = True,
             compute_bytes: int = 4) -> RankMemory:
    """One rank's memory in the run ``facts`` describe, on a ``device_type`` device (rank_memory), its kinds counted
    from the model built on the meta device; with ``activations``, those of one sequence in ``compute_bytes`` per
    value (none are counted under --checkpoint-activations: what it keeps depends on where it cuts)."""
    count, buffers, tensors, saved = model_sizes(cfg, components, task, activations and not facts.checkpointed)
    kinds = counted_kinds(facts, count, buffers, saved * compute_bytes // 4)
    kinds["pinned"] = pinned_rounding(cfg, components, task, facts, device_type)
    return rank_memory(facts, count, kinds, device_type, bookkeeping=tensors * BYTES_PER_TENSOR)


def host_available_bytes(root: str = "/") -> int:
    """The host memory this process may still use: MemAvailable, or less under a cgroup memory limit
    (memory/host_memory.py); ``root``: where /proc and /sys are (tests)."""
    return host_memory(root).available


def memory_needs(est: RankMemory, ranks_on_host: int) -> Dict[str, int]:
    """{"host": bytes, "device": bytes} ``est`` needs (RankMemory.placed), the host shared by ``ranks_on_host``
    ranks. A CPU run needs everything on the host."""
    needs = est.placed()
    needs["host"] *= ranks_on_host
    if est.device_type == "cpu":
        del needs["device"]
    return needs


def check_fits(est: RankMemory, ranks_on_host: int, available: Optional[Dict[str, int]] = None,
               host_source: str = "MemAvailable", device: Optional[torch.device] = None) -> None:
    """Refuse ``est`` when it exceeds the free memory of this rank's GPU (``device``) or of the host
    (``memory_needs``). ``available``: {"host": bytes, "device": bytes}, measured when None (tests pass it, and
    ``host_source``: which limit gave the host's bytes, for the message)."""
    if available is None:
        host = host_memory()
        available, host_source = {"host": host.available}, host.source
        if est.device_type == "cuda":
            available["device"] = torch.cuda.mem_get_info(device)[0]
    for where, need in memory_needs(est, ranks_on_host).items():
        if where in available and need > available[where]:
            raise ConfigError(_message(est, where, need, available[where], ranks_on_host, host_source))


def _undo_fix(est: RankMemory, where: str, need: int, free: int, ranks: int) -> str:
    """--cpu-step after-backward, where the step during backward's copies are counted: first when the run fits
    without them. Stepping after backward, FSDP2 pins the gradients' copies too (pinned.py): their rounding is the
    shards' own, which ``est.pinned`` holds alone while the copies are kept."""
    if where != "host" or not est.undo:
        return ""
    alone = need - ranks * (est.undo - est.pinned) <= free
    return (f"{'' if alone else '; or '}--cpu-step after-backward (stepping each shard during backward keeps a copy of "
            f"its parameter and moments, {est.undo / GIB:.1f} GiB, until --clip-norm, fp16's overflow check, "
            f"--skip-nan-updates or --spike-rollback has decided the update; after backward nothing is copied, but "
            f"the step no longer hides under backward){'; or else with ' if alone else ''}")


def check_run_fits(cfg, components: Components, task, backend, facts: RunFacts) -> None:
    """The run's estimate (see ``estimate``) from its ``facts`` (the ones ``Run`` built), checked against this
    machine, whose memory ``facts.ranks_per_node`` ranks share."""
    try:
        est = estimate(cfg, components, task, facts, backend.device.type,
                       compute_bytes=facts.dtypes.compute.itemsize if facts.dtypes.compute else 4)
    except (RuntimeError, NotImplementedError) as e:  # a plugin's model that cannot be built on meta
        logger.info(f"memory not estimated: the model could not be built on the meta device ({e})")
        return
    check_fits(est, facts.ranks_per_node, device=backend.device)


def _message(est: RankMemory, where: str, need: int, free: int, ranks: int, host_source: str) -> str:
    memory = f"host memory available ({host_source})" if where == "host" else f"free memory of the {where}"
    per = f" per rank, {ranks} ranks on this machine" if where == "host" and ranks > 1 else " for this rank"
    if est.buffers > max(est.state, est.activations):  # the sinusoidal positions: --tokens-per-sample long
        fix = "a smaller --tokens-per-sample (or --max-target-positions): the positions are precomputed for every one"
    elif est.activations > est.state:
        fix = ("--checkpoint-activations (only each layer's input is kept; the rest is recomputed in the backward), "
               "a smaller --tokens-per-sample, or fewer --decoder-layers")
    else:
        fix = ("fewer --decoder-layers or a smaller --decoder-embed-dim/--decoder-ffn-embed-dim, --ddp-backend "
               "fully_sharded over more ranks (it divides parameters, gradients and optimizer state by the number "
               "of ranks), --cpu-offload on a GPU, or --optimizer cpu_adam --fp16-adam-stats")
        if est.snapshot_state:
            fix += ("; or leave out --spike-rollback (its snapshot is a second copy of the parameters, buffers "
                    "and optimizer state)")
    if where == "host" and est.staged:
        fix += ("; or leave out --async-save (it keeps a pinned host copy of each rank's state on the GPU for the "
                "whole run; --cpu-offload's state is written live, not copied)")
    activations = (f"activations of one sequence {est.activations / GIB:.1f} GiB" if est.activations else
                   "activations not counted")
    snapshot = f", --spike-rollback's snapshot {est.snapshot / GIB:.1f}" if est.snapshot else ""
    if est.extra:
        snapshot += f", the backend's copies of the gradients {est.extra / GIB:.1f}"
    if where == "host" and est.staged:
        snapshot += f", --async-save's host copy of the state {est.staged / GIB:.1f}"
    if where == "host" and est.undo:
        snapshot += f", the CPU step during backward's copies of the state {est.undo / GIB:.1f}"
    if where == "host" and est.pinned:
        snapshot += f", pinned blocks rounded up to powers of two {est.pinned / GIB:.1f}"
    undo = _undo_fix(est, where, need, free, ranks)
    fix = undo + fix if undo.endswith("with ") else fix + undo
    return (f"The model cannot fit: it needs about {need / GIB:.1f} GiB{per} (parameters {est.params / GIB:.1f}, "
            f"gradients {est.grads / GIB:.1f}, optimizer state {(est.optimizer + est.master) / GIB:.1f}, buffers such as the "
            f"positions {est.buffers / GIB:.1f}{snapshot}, tensor bookkeeping {est.bookkeeping / GIB:.1f} GiB; "
            f"{activations}), "
            f"but the {memory} is {free / GIB:.1f} GiB. Make it fit with {fix}.")
