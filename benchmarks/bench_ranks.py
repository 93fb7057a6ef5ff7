"""Per-rank code of the multi-process benchmarks (importable by spawned ranks).

``fsdp_overhead``: shard-train's ``--ddp-backend fully_sharded`` against a
bare hand-written FSDP2 loop, both inside the same spawned ranks, so process
start-up and rendezvous are not measured. Rounds alternate between the two so
machine noise hits both alike.
"""
import logging
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from shardtrain.trainer.resolved import Components, build_model
from shardtrain.trainer.loop import Run


def quiet_unless_logging_to_file(cfg) -> None:
    """Rank 0 logs INFO to stdout; keep benchmark output to its figures unless --log-file is set."""
    if not cfg.common.log_file:
        logging.getLogger().setLevel(logging.WARNING)


class Ours:
    """shard-train as users run it: ``Run`` (meta init, FSDP2 wrap, fused Adam), then the loop's
    per-update work: ``Trainer.train_step`` and ``RunMetrics.log_update``."""

    def __init__(self, run: Run):
        self.run = run

    def step(self, batch, global_ntokens: float):
        trainer = self.run.trainer
        out = trainer.train_step([batch])  # computes the global sample size itself (an all-reduce)
        self.run.metrics.log_update(trainer.criterion, out, trainer.num_updates)


class BareFSDP:
    """Plain FSDP2: ``fully_shard`` each block, then the root, on a 1-D mesh over all ranks;
    forward, summed cross-entropy, backward, fused AdamW step, zero_grad."""

    def __init__(self, cfg, task, ctx):
        with torch.device("meta"):
            model = build_model(cfg, Components.of(cfg), task)
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device=ctx.device)
        torch.manual_seed(cfg.common.seed)  # the same initial weights as ours (checked in fsdp_overhead)
        model.init_weights()
        self.model, self.pad, self.world_size = model.train(), task.dictionary.pad(), ctx.world_size
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optimization.lr, weight_decay=0.0,
                                           fused=True)

    def step(self, batch, global_ntokens: float):
        logits = self.model(batch["net_input"]["src_tokens"])
        # FSDP averages gradients over ranks: times world_size gives the gradient of the global token mean
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch["target"].view(-1), ignore_index=self.pad,
                               reduction="sum") / global_ntokens * self.world_size
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def timed(runner, batches, global_ntokens, steps: int) -> float:
    dist.barrier()  # both ranks start together; the barrier at the end waits for the slower one
    start = time.perf_counter()
    for i in range(steps):
        runner.step(batches[i % len(batches)], global_ntokens[i % len(batches)])
    dist.barrier()
    return time.perf_counter() - start


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether two FSDP2 models hold bit-identical shards on every rank."""
    pairs = zip(a.state_dict().values(), b.state_dict().values())
    same = torch.tensor([int(all(torch.equal(x.to_local(), y.to_local()) for x, y in pairs))])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    return bool(same.item())


def to_device(obj, device):
    if torch.is_tensor(obj):
        return obj.to(device)
    return {k: to_device(v, device) for k, v in obj.items()} if isinstance(obj, dict) else obj


def fsdp_overhead(cfg, ctx, steps: int, rounds: int, n_batches: int = 8):
    """Runs on every rank (pass it to call_main through functools.partial); rank 0 returns
    the seconds of each round of ``steps`` steps per loop, global tokens per step and checks."""
    quiet_unless_logging_to_file(cfg)
    run = Run(cfg, ctx)
    ours, bare = Ours(run), BareFSDP(cfg, run.task, ctx)
    same_init = same_weights(run.trainer.model, bare.model)
    itr = run.batch_iterator("train", epoch=1, shuffle=False).next_epoch_itr(shuffle=False)
    batches = [to_device(next(itr), ctx.device) for _ in range(n_batches)]  # the same for both loops
    global_ntokens = torch.tensor([float(b["ntokens"]) for b in batches], dtype=torch.float64)
    dist.all_reduce(global_ntokens)
    global_ntokens = global_ntokens.tolist()
    timed(ours, batches, global_ntokens, 2), timed(bare, batches, global_ntokens, 2)  # warm-up
    t_ours, t_bare = [], []
    for i in range(rounds):  # pairs of rounds back to back, the order swapped every round
        for runner, times in ((ours, t_ours), (bare, t_bare))[::1 if i % 2 == 0 else -1]:
            times.append(timed(runner, batches, global_ntokens, steps))
    params = sum(p.numel() for p in run.trainer.params)
    # Both loops took the same steps on the same batches: without dropout their weights must match bit for bit.
    same_final = same_weights(run.trainer.model, bare.model)
    run.close()
    if not ctx.is_master:
        return None
    return {"t_ours": t_ours, "t_bare": t_bare, "steps": steps, "params": params, "threads": torch.get_num_threads(),
            "tokens_per_step": sum(global_ntokens) / len(global_ntokens), "same_init": same_init,
            "same_final": same_final}
