"""Mains for the warm-ranks tests (tests/architecture/test_warm_ranks.py); module level, so ranks import them."""
import os
import signal

import torch
import torch.distributed as dist

from shardtrain.core.errors import DataError


def main_report(cfg, ctx):
    """What each rank sees: its process, the test's environment and cwd, the group, a sum over the ranks."""
    total = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(total)
    seen = {"pid": os.getpid(), "probe": os.environ.get("WARM_RANKS_PROBE"), "cwd": os.getcwd(),
            "sum": total.item(), "world": dist.get_world_size()}
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, seen)
    os.environ["WARM_RANKS_LEFT_BEHIND"] = "1"  # the next job must not see it
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # nor this handler
    torch.set_num_threads(1)
    return everyone


def main_user_error_on_rank1(cfg, ctx):
    if ctx.rank == 1:
        raise DataError("the shard train.bin is truncated; re-run shard-preprocess")
    dist.barrier()  # never returns: rank 1 is gone


def main_state(cfg, ctx):
    return {"left_behind": os.environ.get("WARM_RANKS_LEFT_BEHIND"),
            "sigusr1_default": signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL, "pid": os.getpid()}
