"""``--ddp-backend legacy_ddp`` (alias ``no_c10d``): one flat all-reduce per update.

As fairseq's legacy mode: no hooks during backward; after the last
accumulation step all gradients are copied into one flat buffer, summed
across ranks in a single all-reduce and copied back. Simpler and
deterministic, at the cost of no overlap with backward.
"""
import torch
import torch.distributed as dist

from shardtrain.trainer.parallel.base import BACKEND_REGISTRY, Backend, GradientCopies


@BACKEND_REGISTRY.register("no_c10d")  # fairseq's name (decorators apply bottom-up: legacy_ddp first)
@BACKEND_REGISTRY.register("legacy_ddp")
class LegacyDDPBackend(Backend):
    @classmethod
    def gradient_copies(cls, distributed):
        return GradientCopies(after_backward=1)  # the flat buffer reduce_grads concatenates them into

    def wrap(self, model):
        model = model.to(self.device)
        for tensor in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(tensor.data, src=0)  # every rank starts from rank 0's weights
        return model

    def reduce_grads(self, params):
        for p in params:
            if p.grad is None:  # a parameter unused on this rank still takes part
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
