"""Entry points run on every rank by tests/trainer/checkpoint/test_hf_ranks.py (importable by spawned children)."""
import re

import torch
from torch.distributed.tensor import DTensor

from shardtrain.trainer.checkpoint.hf_folder import load_folder_into
from shardtrain.trainer.loop import Run


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{key}:\s+(\d+) kB", f.read()).group(1))


def _local_bytes(model) -> int:
    tensors = model.state_dict().values()
    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size() for t in tensors)


def load_and_measure(cfg, ctx):
    """Build the run's model (materialised, initialised), then load --finetune-from-model's folder as a fine-tune
    does, measuring this rank's peak resident memory over the load alone (Linux: /proc/self/clear_refs resets the
    peak). Every rank returns (bytes over the resident memory before the load, its shard's bytes, the largest
    tensor's bytes)."""
    run = Run(cfg, ctx)
    try:
        model = run.trainer.model
        largest = max(t.numel() * t.element_size() for t in model.state_dict().values())  # global shapes
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kb("VmRSS")
        load_folder_into(model, cfg.checkpoint.finetune_from_model)
        peak = (_status_kb("VmHWM") - before) * 1024
        local = _local_bytes(model)
        gathered = torch.tensor([peak, local], dtype=torch.int64)
        every = [torch.zeros_like(gathered) for _ in range(ctx.world_size)]
        torch.distributed.all_gather(every, gathered)
    finally:
        run.close()
    return [tuple(t.tolist()) + (largest,) for t in every] if ctx.is_master else None
