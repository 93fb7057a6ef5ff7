"""What benchmarks/async_save.py and checkpoint.py measure shardtrain's sharded saves against: the
behaviours before, built here from the product's pieces (the product keeps only what it uses).

- ``CopyEverythingSaver``: --async-save with one reused host copy of every tensor, made before save()
  returns; nothing is written live, so no optimizer step waits.
- ``DcpStagerSaver``: --async-save as first built: DCP's own stager, a fresh host copy of everything
  at every save.
- ``SaverWithoutChecksums``: a sync sharded save as before checksums: nothing hashed, no CHECKSUMS,
  a COMPLETE marker that says so (what a checkpoint from before checksums holds).
"""
import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from shardtrain.core.fileio import atomic_open
from shardtrain.trainer.checkpoint.async_staging import RunStager, on_host
from shardtrain.trainer.checkpoint.checksums import dcp_writer
from shardtrain.trainer.checkpoint.sharded_saver import EXTRA, FORMAT, ShardedSaver, make_partial, publish
from shardtrain.trainer.launch import ranks


class CopyEverything(RunStager):
    """The run's reused buffers, but no tensor is left in place to be written live."""

    def stage(self, state, in_place):
        return super().stage(state, in_place=set())


class CopyEverythingSaver(ShardedSaver):
    def __init__(self):
        super().__init__(async_save=True)
        self.stager = CopyEverything()


class DcpStagerSaver(ShardedSaver):
    def __init__(self):
        super().__init__(async_save=True)

    def _stage(self, state, model):
        return state  # DCP's stager copies it, inside dcp.async_save

    def _write_in_background(self, state, writer):
        return dcp.async_save(state, storage_writer=writer, process_group=self._gloo_group())


class SaverWithoutChecksums:
    """ShardedSaver's sync save less its checksums: DCP's plain writer, then extra.pt, the marker
    and the rename into place (the same make_partial and publish)."""

    def save(self, save_dir: str, name: str, model, optimizer, extra, aliases) -> str:
        final, partial = os.path.join(save_dir, name), os.path.join(save_dir, f".{name}.partial")
        spare = make_partial(partial)
        state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
        dcp.save(state, storage_writer=dcp_writer(partial, on_host(state)), no_dist=not dist.is_initialized())
        if ranks.rank() == 0:
            spare.release()
            with atomic_open(os.path.join(partial, EXTRA)) as f:
                torch.save(extra, f)
            info = {"format": FORMAT, "world_size": ranks.world_size(), "name": name, "interval": False,
                    "checksums": False}
            publish(save_dir, name, partial, final, json.dumps(info).encode(), aliases)
        ranks.barrier()
        return final

    def close(self) -> None:
        pass  # nothing held between saves
