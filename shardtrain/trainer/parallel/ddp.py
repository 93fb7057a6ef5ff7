"""``--ddp-backend pytorch_ddp`` (alias ``c10d``): torch DistributedDataParallel.

Gradients are all-reduced in buckets during backward, overlapping with it;
accumulation steps run under ``no_sync`` so only the last micro-batch of an
update communicates.
"""
from shardtrain.core.torch_private import ddp_without_forward_buffer_sync
from shardtrain.trainer.parallel.base import BACKEND_REGISTRY, Backend, GradientCopies


@BACKEND_REGISTRY.register("c10d")  # fairseq's name (decorators apply bottom-up: pytorch_ddp first)
@BACKEND_REGISTRY.register("pytorch_ddp")
class DDPBackend(Backend):
    grads_are_averaged = True

    @classmethod
    def plan_variants(cls, name, world_size, ranks_per_node):
        """DDP, and with ZeRO's sharded optimizer state where there are ranks to shard it over."""
        return [(name, {"zero_sharding": "none"})] + (
            [(f"{name} + zero os", {"zero_sharding": "os"})] if world_size > 1 else [])

    @classmethod
    def gradient_copies(cls, distributed):
        """The buckets: a second copy of every gradient, unless --gradient-as-bucket-view makes .grad a view."""
        return GradientCopies(during_backward=0 if distributed.gradient_as_bucket_view else 1)

    def wrap(self, model):
        model, d = model.to(self.device), self.distributed
        # Buffers are broadcast once, when wrapped: our models have no buffers that training changes.
        return ddp_without_forward_buffer_sync(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
            bucket_cap_mb=d.bucket_cap_mb, find_unused_parameters=d.find_unused_parameters,
            gradient_as_bucket_view=d.gradient_as_bucket_view)

    def no_sync(self, module):
        return module.no_sync()
