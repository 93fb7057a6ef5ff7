"""Train with shard-train's own launcher in this process, then record on every rank whether it
initialised CUDA and on which devices it holds a CUDA context:
``python -c "import no_cuda_main; no_cuda_main.run(ARGV)"``.

A module (not ``__main__``) so the spawned ranks can import ``train_then_report`` by name.
"""
import json
import os

import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer import loop
from shardtrain.trainer.launch import start as launch


def contexts():
    """The indices of the devices on which this process holds a CUDA context (finding out creates none).

    Why private: torch has no public query; ``torch._C._cuda_hasPrimaryContext`` asks the driver
    (cuDevicePrimaryCtxGetState), as torch's autograd engine does before it sets a device."""
    if not torch.cuda.is_available() or not hasattr(torch._C, "_cuda_hasPrimaryContext"):
        return None
    return [i for i in range(torch.cuda.device_count()) if torch._C._cuda_hasPrimaryContext(i)]


def train_then_report(cfg, ctx):
    valid_loss = loop.main(cfg, ctx)
    with open(os.path.join(cfg.checkpoint.save_dir, f"cuda-rank{ctx.rank}.json"), "w") as f:
        json.dump({"cuda_initialized": torch.cuda.is_initialized(), "contexts": contexts(),
                   "device": str(ctx.device)}, f)
    return valid_loss


def run(argv):
    cfg = parse_train_args(argv)
    launch.call_main(cfg, train_then_report)
    with open(os.path.join(cfg.checkpoint.save_dir, "cuda-launcher.json"), "w") as f:
        json.dump({"cuda_initialized": torch.cuda.is_initialized()}, f)
