"""Entry point run on every rank by test_fsdp_accumulation.py (importable by spawned children)."""
import torch
import torch.distributed as dist

from shardtrain.trainer.loop import Run, train
from st_testutils import record_losses


def train_and_measure_cuda(cfg, ctx):
    """Train through the real loop; rank 0 returns (per-update losses, the largest
    peak allocated bytes of the run over ranks, parameters in the model)."""
    torch.cuda.reset_peak_memory_stats(ctx.device)  # one GPU runs in the test's process, after other runs
    run = Run(cfg, ctx)
    losses = record_losses(run.trainer)
    try:
        train(run)
        # every log record resets the allocator's peak: the run's own peak is kept by its metrics
        peak = torch.tensor([float(run.metrics.run_peak_alloc_bytes())], device=ctx.device)
        if ctx.world_size > 1:  # before close: on one GPU the backend owns (and destroys) its 1-rank group
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        n_params = sum(p.numel() for p in run.trainer.params)  # DTensor numel is the global size
    finally:
        run.close()
    return (losses, peak.item(), n_params) if ctx.is_master else None
