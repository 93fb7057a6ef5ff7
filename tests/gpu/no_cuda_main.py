"""Train with shard-train's own launcher in this process, then record on every rank
whether it created a CUDA context: ``python -c "import no_cuda_main; no_cuda_main.run(ARGV)"``.

A module (not ``__main__``) so the spawned ranks can import ``train_then_report`` by name.
"""
import json
import os

import torch

from shardtrain.config.build import parse_train_args
from shardtrain.trainer import loop
from shardtrain.trainer.launch import start as launch


def train_then_report(cfg, ctx):
    valid_loss = loop.main(cfg, ctx)
    with open(os.path.join(cfg.checkpoint.save_dir, f"cuda-rank{ctx.rank}.json"), "w") as f:
        json.dump({"cuda_initialized": torch.cuda.is_initialized(), "device": str(ctx.device)}, f)
    return valid_loss


def run(argv):
    cfg = parse_train_args(argv)
    launch.call_main(cfg, train_then_report)
    with open(os.path.join(cfg.checkpoint.save_dir, "cuda-launcher.json"), "w") as f:
        json.dump({"cuda_initialized": torch.cuda.is_initialized()}, f)
