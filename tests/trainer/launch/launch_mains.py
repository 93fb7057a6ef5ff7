"""Module-level mains for the launch tests (spawned ranks import them by name).

Each writes what its rank saw to ``<cfg.checkpoint.save_dir>/rank<N>.json``, so
the test process can check every rank, not only the result rank 0 returns.
Run as a script (under torchrun) it parses flags and calls ``call_main`` itself.
"""
import json
import logging
import os
import sys
import time

import torch
import torch.distributed as dist

from shardtrain.core.errors import DataError


def _record(cfg, ctx, **extra):
    seen = {
        "pid": os.getpid(),
        "rank": ctx.rank, "local_rank": ctx.local_rank, "world_size": ctx.world_size,
        "device": str(ctx.device), "backend": ctx.backend, "is_master": ctx.is_master,
        "group_initialized": dist.is_initialized(),
        "root_log_level": logging.getLogger().level,
        "threads": torch.get_num_threads(),
    }
    if dist.is_initialized():
        seen["dist_rank"] = dist.get_rank()
        seen["dist_world_size"] = dist.get_world_size()
        seen["dist_backend"] = dist.get_backend()
    seen.update(extra)
    with open(os.path.join(cfg.checkpoint.save_dir, f"rank{ctx.rank}.json"), "w") as f:
        json.dump(seen, f)


def main_all_reduce(cfg, ctx):
    """All-reduce the ranks (0 + 1 = 1 for two ranks) and return a rank-specific value."""
    total = torch.tensor([float(ctx.rank)], device=ctx.device)
    if dist.is_initialized():
        dist.all_reduce(total)
    _record(cfg, ctx, rank_sum=total.item())
    return {"from_rank": ctx.rank, "value": 0.5 + ctx.rank}


def _recorded_by_both(cfg, ctx):
    """Both ranks have written their record before rank 1 fails: else the launcher may stop rank 0 before it writes
    (a race seen once in the whole suite), and the test cannot name the pid it checks is gone."""
    _record(cfg, ctx)
    dist.barrier()


def main_user_error_on_rank1(cfg, ctx):
    """Rank 1 raises a user error; rank 0 waits in a barrier that rank 1 never reaches."""
    _recorded_by_both(cfg, ctx)
    if ctx.rank == 1:
        raise DataError("the shard train.bin is truncated; re-run shard-preprocess")
    dist.barrier()
    time.sleep(600)  # only reached if the barrier wrongly returned: the test's time check catches it


def main_bug_on_rank1(cfg, ctx):
    _recorded_by_both(cfg, ctx)
    if ctx.rank == 1:
        {}["no_such_key_in_rank1"]
    dist.barrier()
    time.sleep(600)


def main_exit_on_rank1(cfg, ctx):
    """Rank 1 dies without a Python exception while rank 0 waits in an all-reduce."""
    _recorded_by_both(cfg, ctx)
    if ctx.rank == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(1))
    time.sleep(600)


def main_stall_on_rank1(cfg, ctx):
    """Rank 1 stays alive but never joins rank 0's barrier: only the group's timeout ends rank 0."""
    _record(cfg, ctx, barrier_at=time.time())
    if ctx.rank == 1:
        time.sleep(600)
    dist.barrier()


def main_in_process(cfg, ctx):
    _record(cfg, ctx)
    return "ran-in-process"


def main_where_started(cfg, ctx):
    """Record how this rank was started (its parent's command line) and what it inherited (an environment variable,
    the launcher's stdout)."""
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().replace(b"\0", b" ").decode()
    said = os.environ.get("ST_LAUNCH_MARK", "")
    print(f"rank {ctx.rank} says {said}", flush=True)
    _record(cfg, ctx, ppid=os.getppid(), parent=parent, mark=said)


def main_dtensor_op_on_a_mesh(cfg, ctx):
    """A ("shard",) mesh over the ranks and an op on a DTensor over it; the mesh is on a second group when
    ``ST_EXTRA_GROUP`` is set (a run with one group more). -> the name of the group the op's output resolves to."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    if os.environ.get("ST_EXTRA_GROUP"):
        mesh = DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu", mesh_dim_names=("shard",))
    else:
        mesh = init_device_mesh("cpu", (ctx.world_size,), mesh_dim_names=("shard",))
    out = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)]) * 2
    return {"mesh": mesh._dim_group_names, "resolved": out.device_mesh.get_group().group_name}


if __name__ == "__main__":  # under torchrun: launch_mains.py OUT_DIR [shard-train flags]
    from shardtrain.config.run_config import parse_train_args
    from shardtrain.trainer.launch.start import call_main

    out_dir = sys.argv[1]
    cfg = parse_train_args([out_dir, "--cpu", "--batch-size", "1", "--save-dir", out_dir,
                            "--heartbeat-timeout", "60", *sys.argv[2:]])
    result = call_main(cfg, main_all_reduce)
    with open(os.path.join(out_dir, f"after{os.environ['RANK']}.json"), "w") as f:
        json.dump({"result": result, "group_initialized_after": dist.is_initialized()}, f)

