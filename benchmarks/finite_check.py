"""What the finiteness check before every save costs, next to the save itself.

The model of benchmarks/checkpoint.py (one process, ``fully_sharded`` on a 1-rank
gloo group, ~97M parameters with Adam state). After one update: the median time
of ``check_finite`` (a fused max-abs pass over the parameters and the optimizer
state, then one all-reduce) against the median time of a synchronous sharded save
of the same run (DCP, through the run's CheckpointManager, the loop's path).

    python benchmarks/finite_check.py [--layers 12 --dim 768 --repeats 3]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint import config  # noqa: E402
from make_data import random_data_bin  # noqa: E402

from shardtrain.trainer.checkpoint.finite import check_finite  # noqa: E402
from shardtrain.trainer.launch.start import make_context  # noqa: E402
from shardtrain.trainer.loop import Run  # noqa: E402


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ctx = make_context(0, 0, 1, use_cuda=False, backend=None)
    with tempfile.TemporaryDirectory() as tmp:
        data = random_data_bin(os.path.join(tmp, "data-bin"), vocab=8000, lines=200, line_len=100)
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'pg')}", rank=0, world_size=1)
        try:
            cfg = config(tmp, data, os.path.join(tmp, "ck"), args.layers, args.dim)
            cfg.checkpoint.no_save = False
            run = Run(cfg, ctx)
            itr = run.batch_iterator("train", 1, shuffle=True)
            run.trainer.train_step([next(itr.next_epoch_itr())])
            trainer = run.trainer
            check = timed(lambda: check_finite(trainer.model, trainer.optimizer, run.backend, 1), args.repeats)
            save = timed(lambda: run.checkpoints.save(run.checkpoint_header(), run.checkpoint_parts(itr), 1, 1,
                                                      ["checkpoint_last.pt"]), args.repeats)
            run.close()
        finally:
            dist.destroy_process_group()
    params = sum(p.numel() for p in trainer.params) / 1e6
    print(f"{params:.0f}M parameters + Adam state; medians of {args.repeats}")
    print(f"finiteness check : {check:.3f} s")
    print(f"sync sharded save: {save:.3f} s")
    print(f"RESULT finite_check_cost={check / save:.4f} target<=0.05")


if __name__ == "__main__":
    main()
