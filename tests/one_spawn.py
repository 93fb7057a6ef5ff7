"""Many runs on one group of spawned ranks: each spawned rank imports torch (seconds, more on a loaded
machine) and joins the group once, then runs every job in turn, as PyTorch's own distributed tests keep
one group alive across many checks."""
import functools

from shardtrain.trainer.launch.start import call_main


def _each(cfg, ctx, jobs):
    results = [main(job_cfg, ctx) for main, job_cfg in jobs]
    return results if ctx.is_master else None


def call_each(jobs):
    """Rank 0's result of ``main(cfg, ctx)`` for each ``(main, cfg)`` of ``jobs``, in order, all on the ranks
    one ``call_main`` starts (``main`` importable by the spawned ranks; every cfg the same world size)."""
    sizes = {cfg.distributed.distributed_world_size for _, cfg in jobs}
    assert len(sizes) == 1, f"one group of ranks runs every job: world sizes {sizes}"
    return call_main(jobs[0][1], functools.partial(_each, jobs=jobs))
