"""``--ddp-backend pytorch_ddp`` (alias ``c10d``): torch DistributedDataParallel.

Gradients are all-reduced in buckets during backward, overlapping with it;
accumulation steps run under ``no_sync`` so only the last micro-batch of an
update communicates.
"""
from torch.nn.parallel import DistributedDataParallel

from shardtrain.trainer.parallel.backend import BACKEND_REGISTRY, Backend


class DDPBackend(Backend):
    grads_are_averaged = True

    def wrap(self, model):
        model = model.to(self.device)
        return DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
            bucket_cap_mb=self.cfg.bucket_cap_mb, find_unused_parameters=self.cfg.find_unused_parameters,
            gradient_as_bucket_view=self.cfg.gradient_as_bucket_view,
            forward_sync_buffers=False)  # our models have no buffers that training changes

    def no_sync(self, module):
        return module.no_sync()


BACKEND_REGISTRY.add("pytorch_ddp", DDPBackend)
BACKEND_REGISTRY.add("c10d", DDPBackend)
