"""Entry point for the fp16 lockstep test (importable by spawned ranks)."""
import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from shardtrain.trainer.loop import Run, train

LOSS_INF_AT = 3    # train_step call at which rank 1's loss becomes inf (before any communication)
SHARD_INF_AT = 6   # call at which one element of rank 1's own gradient shard becomes inf (fully_sharded)


def _checksum(params) -> float:
    """The full weights' sum, the same value on every rank (a collective for DTensors)."""
    total = 0.0
    for p in params:
        full = p.full_tensor() if isinstance(p, DTensor) else p
        total += float(full.detach().double().sum())
    return total


def train_with_injected_overflows(cfg, ctx):
    """Train with inf injected on rank 1 only; every rank returns its per-call records
    (call, stepped, loss_scale, num_updates, checksum before, checksum after), gathered on rank 0."""
    run = Run(cfg, ctx)
    trainer = run.trainer
    calls, records = [0], []
    criterion, grad_norm, step = trainer.criterion, trainer.backend.grad_norm, trainer.train_step

    class Injecting:
        def __getattr__(self, name):
            return getattr(criterion, name)

        def __call__(self, model, sample):
            loss, size, log = criterion(model, sample)
            return (loss * math.inf if ctx.rank == 1 and calls[0] == LOSS_INF_AT else loss), size, log

    def injecting_grad_norm(params):  # after the gradients are reduced, before the global norm
        if ctx.rank == 1 and calls[0] == SHARD_INF_AT and cfg.distributed.ddp_backend == "fully_sharded":
            grad = next(p.grad for p in params if p.grad is not None)
            (grad.to_local() if isinstance(grad, DTensor) else grad).view(-1)[0] = math.inf
        return grad_norm(params)

    def recording_step(samples):
        calls[0] += 1
        before = _checksum(trainer.params)
        out = step(samples)
        records.append((calls[0], out["stepped"], out["loss_scale"], trainer.num_updates, before,
                        _checksum(trainer.params)))
        return out

    trainer.criterion, trainer.backend.grad_norm, trainer.train_step = Injecting(), injecting_grad_norm, recording_step
    try:
        train(run)
        gathered = [None] * ctx.world_size
        dist.all_gather_object(gathered, records)
    finally:
        run.close()
    return gathered if ctx.is_master else None
