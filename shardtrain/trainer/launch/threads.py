"""How many CPU threads each rank's torch uses: one policy for every launcher.

Each rank takes an equal share of the cores it may run on:
``usable cores // ranks on this node``, at least 1, where usable cores come
from ``os.sched_getaffinity`` (a cgroup, ``taskset`` or SLURM binding) and the
ranks on this node from the launcher: shard-train's own spawn (all ranks are
local), torchrun (``LOCAL_WORLD_SIZE``), SLURM (``SLURM_NTASKS_PER_NODE``, else
this node's entry of ``SLURM_STEP_TASKS_PER_NODE``). Under SLURM with
``--cpus-per-task`` each task gets exactly those cores, so
``SLURM_CPUS_PER_TASK`` (capped at the usable cores) replaces the division:
with task binding the affinity already holds only the task's own cores.

``--threads N`` overrides all of this. An ``OMP_NUM_THREADS`` in the
environment is the user's choice and is kept, with one exception: torchrun
writes ``OMP_NUM_THREADS=1`` for its children whenever it starts more than one
process per node and the variable was unset (torch/distributed/run.py, with a
warning). Its children cannot tell that default from a user's 1, and keeping
it leaves the CPU optimizer, unscaling and clipping of --cpu-offload on one
thread, so under torchrun with more than one local rank a 1 is ignored (pass
``--threads 1`` to really get one).

``plan_threads`` decides, without side effects; ``apply_threads`` is its one
caller in a rank (from ``launch``).
"""
import dataclasses
import logging
import os
import re
from typing import Mapping, Optional

import torch

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ThreadPlan:
    threads: int
    reason: str  # for the log line: where the number came from


def plan_threads(requested: int, cores: int, env: Mapping[str, str], launcher: Optional[str],
                 spawned_ranks: int = 1) -> ThreadPlan:
    """Threads for one rank. ``launcher``: "torchrun", "slurm", or None (shard-train's
    own processes: ``spawned_ranks`` of them on this machine, 1 without a spawn)."""
    if requested > 0:
        return ThreadPlan(requested, f"--threads {requested}")
    local = local_ranks(env, launcher, spawned_ranks)
    omp = env.get("OMP_NUM_THREADS", "").strip()
    torchrun_default = launcher == "torchrun" and local > 1 and omp == "1"
    omp_threads = _positive_int(omp.split(",")[0]) if omp and not torchrun_default else None
    if omp_threads is not None:
        return ThreadPlan(omp_threads, f"OMP_NUM_THREADS={omp}; --threads to override")
    note = "; torchrun's default OMP_NUM_THREADS=1 ignored" if torchrun_default else ""
    per_task = _positive_int(env.get("SLURM_CPUS_PER_TASK", "")) if launcher == "slurm" else None
    if per_task is not None:
        return ThreadPlan(min(per_task, cores),
                          f"SLURM_CPUS_PER_TASK={per_task}, {cores} usable cores; --threads to override")
    return ThreadPlan(max(1, cores // local),
                      f"{cores} usable cores / {local} local rank{'s' if local > 1 else ''}{note}; "
                      "--threads to override")


def local_ranks(env: Mapping[str, str], launcher: Optional[str], spawned_ranks: int = 1) -> int:
    """How many ranks of this job share this node's cores."""
    if launcher == "torchrun":
        return _positive_int(env.get("LOCAL_WORLD_SIZE", "")) or 1
    if launcher == "slurm":
        return (_positive_int(env.get("SLURM_NTASKS_PER_NODE", ""))
                or _slurm_tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", ""),
                                        _positive_int(env.get("SLURM_NODEID", "")) or 0)
                or _positive_int(env.get("SLURM_NTASKS", "")) or 1)  # unknown: never oversubscribe
    return max(1, spawned_ranks)


def _slurm_tasks_on_node(spec: str, node: int) -> Optional[int]:
    """This node's count in SLURM's compressed form: "2(x3),1" is 2, 2, 2, 1."""
    counts = []
    for item in filter(None, spec.split(",")):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node] if node < len(counts) and counts[node] > 0 else None


def _positive_int(text: str) -> Optional[int]:
    text = text.strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


OVERSUBSCRIBED = 2  # CPU ranks per usable core above which the launcher warns before it starts them


def oversubscription_warning(ranks: int, cores: int) -> Optional[str]:
    """What starting ``ranks`` CPU ranks on ``cores`` usable cores costs, when they far exceed them."""
    if ranks <= OVERSUBSCRIBED * cores:
        return None
    return (f"starting {ranks} CPU ranks on {cores} usable core{'s' if cores > 1 else ''} ({ranks / cores:.0f} per "
            "core): each rank is a process of its own (a few hundred MB of memory each, and seconds of CPU to start) "
            "before any of them trains, then they take turns on the cores, so the start alone can take minutes and "
            f"every update is slower than with fewer ranks. Unless that is the point, pass --distributed-world-size "
            f"{cores} (one rank per core) or less.")


def apply_threads(requested: int, rank: int, launcher: Optional[str], spawned_ranks: int = 1) -> int:
    """Set this rank's torch threads by the policy above and say so once."""
    plan = plan_threads(requested, usable_cores(), os.environ, launcher, spawned_ranks)
    torch.set_num_threads(plan.threads)
    logger.info(f"rank {rank}: {plan.threads} thread{'s' if plan.threads > 1 else ''} ({plan.reason})")
    return plan.threads
