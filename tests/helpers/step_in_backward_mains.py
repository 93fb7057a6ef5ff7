"""Entry points run on every rank by tests/trainer/parallel/test_step_in_backward.py (importable by spawned
ranks), and what that test's in-process checks share with them.

A case trains the same updates twice on each rank, stepping during backward (``cfg``) and after it
(``cfg_after``, --cpu-step after-backward), driving ``Trainer.train_step`` itself so that chosen calls can
scale the loss (x100: clipping fires; x inf or NaN: the update is skipped), and compares this rank's shards
and Adam state bit for bit.
"""
import contextlib
import os
import threading
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from shardtrain.data.collate import collate
from shardtrain.core.dtensors import local_tensor as _local
from shardtrain.optim.cpu_adam import CPUAdam
from shardtrain.trainer.loop import Run

SAMPLES_PER_BATCH = 2


class ScaledLoss:
    """The run's criterion with its loss multiplied by ``scale`` (the log, and so the logged loss, untouched):
    the test sets it before each call of train_step."""

    def __init__(self, criterion):
        self.criterion, self.scale = criterion, 1.0

    def __call__(self, model, sample):
        loss, sample_size, log = self.criterion(model, sample)
        return (loss if self.scale == 1.0 else loss * self.scale), sample_size, log

    def __getattr__(self, name):  # sentence_avg, ...
        return getattr(self.criterion, name)


@contextlib.contextmanager
def counting_step_one():
    """Counts of ``CPUAdam.step_one`` calls: {"worker": from another thread than the training thread (the
    step-in-backward worker), "training": from the training thread}."""
    counts = {"worker": 0, "training": 0}
    original = CPUAdam.step_one
    training = threading.current_thread()

    def counted(self, p, multiplier, keep, **kwargs):
        counts["training" if threading.current_thread() is training else "worker"] += 1
        return original(self, p, multiplier, keep, **kwargs)

    CPUAdam.step_one = counted
    try:
        yield counts
    finally:
        CPUAdam.step_one = original


def batches(task, rank: int, call: int, update_freq: int) -> List[Dict]:
    """Call ``call``'s micro-batches on rank ``rank``: every rank and micro-batch its own samples."""
    dataset = task.dataset("train")
    pad = task.dictionary.pad()
    out = []
    for micro in range(update_freq):
        first = ((call * 2 + rank) * update_freq + micro) * SAMPLES_PER_BATCH
        out.append(collate([dataset[(first + k) % len(dataset)] for k in range(SAMPLES_PER_BATCH)], pad))
    return out


def record(out: Dict, trainer) -> Dict:
    """What one call of train_step reports, and the update count after it."""
    logs = out["logs"][0]
    return {"loss": logs["loss"] / out["sample_size"], "gnorm": out["gnorm"], "clip": out["clip"],
            "stepped": out["stepped"], "loss_scale": out.get("loss_scale"), "num_updates": trainer.num_updates,
            "lr": out["lr"]}


def local_state(trainer) -> Dict[str, tuple]:
    """Per parameter name (its index where the model no longer names it: FSDP2 leaves a model whose backward
    failed unsharded): this rank's shard, and its Adam exp_avg, exp_avg_sq and step (None where absent)."""
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    out = {}
    for i, p in enumerate(trainer.params):
        state = trainer.optimizer.state.get(p, {})
        moments = tuple(_local(state[k]).clone() if k in state else None for k in ("exp_avg", "exp_avg_sq"))
        out[names.get(id(p), str(i))] = (_local(p).detach().clone(),) + moments + (
            state["step"].clone() if "step" in state else None,)
    return out


def _train(cfg, ctx, calls, scales: Dict[int, float], resume_file: Optional[str] = None,
           resume_at: Optional[int] = None) -> Dict:
    """Train ``calls`` calls of train_step on a fresh run; with ``resume_at``, save the trainer's state
    after that many calls to ``resume_file`` and go on in a freshly built run that loads it."""
    run = Run(cfg, ctx)
    built = [run.trainer.step_in_backward is not None]
    initial = local_state(run.trainer)
    records = []
    update_freq = cfg.optimization.update_freq[0]
    try:
        with counting_step_one() as counts:
            for call in calls:
                if call == resume_at:
                    state = run.trainer.state_dict()  # the full state, on rank 0 (a collective)
                    if ctx.is_master:
                        torch.save(state, resume_file)
                    dist.barrier()
                    run.close()
                    run = Run(cfg, ctx)
                    run.trainer.load_state_dict(torch.load(resume_file, weights_only=False))
                    built.append(run.trainer.step_in_backward is not None)
                trainer = run.trainer
                if not isinstance(trainer.criterion, ScaledLoss):
                    trainer.criterion = ScaledLoss(trainer.criterion)
                trainer.criterion.scale = scales.get(call, 1.0)
                out = trainer.train_step(batches(run.task, ctx.rank, call, update_freq))
                records.append(record(out, trainer))
        final = local_state(run.trainer)
        n_params = len(run.trainer.params)
    finally:
        run.close()
    moved = sum(not torch.equal(initial[n][0], final[n][0]) for n in final)
    return {"built": built, "records": records, "state": final, "counts": dict(counts), "n_params": n_params,
            "moved": moved}


def _differences(a: Dict[str, tuple], b: Dict[str, tuple]) -> List[str]:
    """``name.part`` for every tensor (shard, exp_avg, exp_avg_sq, step) not bitwise equal, or absent in one."""
    out = [] if a.keys() == b.keys() else ["parameter names"]
    for name in a.keys() & b.keys():
        for part, x, y in zip(("param", "exp_avg", "exp_avg_sq", "step"), a[name], b[name]):
            if x is None or y is None or not torch.equal(x, y):
                out.append(f"{name}.{part}")
    return sorted(out)


def compare_case(cfg, ctx, cfg_after, calls: int, scales: Dict[int, float], resume_at: Optional[int] = None):
    """Train ``cfg`` (stepping during backward) and ``cfg_after`` (--cpu-step after-backward) for ``calls``
    calls of train_step from the same seed, ``cfg``'s run resumed after ``resume_at`` calls if given. Rank 0
    returns each rank's {"differences", "records" and "counts" of both runs, "built", "n_params", "moved",
    "numel"}."""
    resume_file = os.path.join(cfg.checkpoint.save_dir, "step_in_backward_resume.pt")
    during = _train(cfg, ctx, range(calls), scales, resume_file, resume_at)
    after = _train(cfg_after, ctx, range(calls), scales)
    mine = {"differences": _differences(during["state"], after["state"]),
            "records": (during["records"], after["records"]), "counts": (during["counts"], after["counts"]),
            "built": (during["built"], after["built"]), "n_params": during["n_params"], "moved": during["moved"],
            "numel": sum(t[0].numel() for t in during["state"].values())}
    every = [None] * ctx.world_size
    dist.all_gather_object(every, mine)
    return every if ctx.is_master else None
