"""The staging buffer of ``--async-save``: one per run, reused by every save.

An async save must snapshot the model and optimizer before ``save()`` returns:
the next optimizer step changes every parameter and every moment in place
(on the CPU under ``--cpu-offload``), so a background write of the live
tensors would mix two updates. Given no stager, DCP's ``async_save`` builds a
fresh one per save, which allocates a new, pageable copy of every tensor (page
faults on every save; for GPU state, a slow blocking copy to pageable memory)
and frees it after the write.

Here one ``DefaultStager`` serves the whole run. It keys its buffers by the
source tensor's storage, so the first save allocates them and later saves
copy into the same memory: the host holds at most one snapshot of this rank's
state, allocated once. For GPU-resident state the buffers are pinned and the
copies non-blocking (then synchronized before returning); for CPU-resident
state pinning buys nothing and would lock host RAM, so it is off. Staging
itself is synchronous: training may step as soon as ``save()`` returns.
"""
from typing import Any, Optional

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


def staging_options(device: torch.device) -> StagingOptions:
    """How to stage state that lives on ``device``."""
    on_accelerator = device.type != "cpu"
    return StagingOptions(use_pinned_memory=device.type == "cuda",  # pinning is a CUDA host allocation
                          use_shared_memory=False,  # the writer is a thread of this process
                          use_async_staging=False,  # the snapshot must be whole before training steps
                          use_non_blocking_copy=on_accelerator)


def state_device(state: Any) -> Optional[torch.device]:
    """Where the first tensor in ``state`` lives (a DTensor's local shard: on the CPU
    under --cpu-offload, whatever the mesh's device)."""
    if isinstance(state, torch.Tensor):
        return state.to_local().device if hasattr(state, "to_local") else state.device
    values = state.values() if isinstance(state, dict) else state if isinstance(state, (list, tuple)) else ()
    for value in values:
        device = state_device(value)
        if device is not None:
            return device
    return None


class RunStager:
    """Creates the run's stager at the first save (when the state's device is known)."""

    def __init__(self):
        self._stager: Optional[DefaultStager] = None
        self.created = 0  # stagers made over the run: 1 however many saves

    def get(self, state) -> DefaultStager:
        if self._stager is None:
            self._stager = DefaultStager(staging_options(state_device(state) or torch.device("cpu")))
            self.created += 1
        return self._stager

    def close(self) -> None:
        """Free the buffers (after the last save has been written)."""
        if self._stager is not None:
            self._stager.close()
            self._stager = None
