"""The process group of a one-process run whose backend needs one.

A run of one rank gets no process group from the launcher (``start``: nothing to
rendezvous with), but FSDP2 builds its device mesh on a group even for one rank (one
GPU with --cpu-offload, say). The run asks its backend class (``needs_process_group``)
and starts the group here, before building the backend: process groups are made by
launch, never by a backend.
"""
import os
import shutil
import tempfile

import torch
import torch.distributed as dist

from shardtrain.core.torch_private import end_process_group
from shardtrain.trainer.launch.rendezvous import process_group_backend


class OneRankGroup:
    """A 1-rank group through a file in a fresh temporary directory (no port to collide on),
    nccl (with gloo for CPU tensors) for a CUDA device, gloo otherwise. Nothing is started
    when a group exists already (a launcher's or a test's): ``close`` then leaves it alone."""

    def __init__(self, device: torch.device):
        self.started = not dist.is_initialized()
        self._dir = None  # the rendezvous file's directory: removed with the group
        if self.started:
            self._dir = tempfile.mkdtemp(prefix="shardtrain-pg-")
            backend = process_group_backend("nccl" if device.type == "cuda" else "gloo")
            try:
                dist.init_process_group(backend, init_method=f"file://{os.path.join(self._dir, 'rendezvous')}",
                                        rank=0, world_size=1)
            except BaseException:
                self._remove_dir()
                raise

    def close(self) -> None:
        if self.started and dist.is_initialized():
            end_process_group()
        self.started = False
        self._remove_dir()  # the store removes its file when the group ends, but not the directory

    def _remove_dir(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> "OneRankGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
