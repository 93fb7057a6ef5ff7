"""The process group of a one-process run whose backend needs one.

A run of one rank gets no process group from the launcher (``start``: nothing to
rendezvous with), but FSDP2 builds its device mesh on a group even for one rank (one
GPU with --cpu-offload, say). The run asks its backend class (``needs_process_group``)
and starts the group here, before building the backend: process groups are made by
launch, never by a backend.
"""
import os
import tempfile

import torch
import torch.distributed as dist

from shardtrain.trainer.launch.rendezvous import process_group_backend


class OneRankGroup:
    """A 1-rank group through a file in a fresh temporary directory (no port to collide on),
    nccl (with gloo for CPU tensors) for a CUDA device, gloo otherwise. Nothing is started
    when a group exists already (a launcher's or a test's): ``close`` then leaves it alone."""

    def __init__(self, device: torch.device):
        self.started = not dist.is_initialized()
        if self.started:
            path = os.path.join(tempfile.mkdtemp(prefix="shardtrain-pg-"), "rendezvous")
            backend = process_group_backend("nccl" if device.type == "cuda" else "gloo")
            dist.init_process_group(backend, init_method=f"file://{path}", rank=0, world_size=1)

    def close(self) -> None:
        if self.started and dist.is_initialized():
            dist.destroy_process_group()
        self.started = False

    def __enter__(self) -> "OneRankGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
