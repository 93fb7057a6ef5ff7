"""``nag``: fairseq 0.12's Nesterov accelerated gradient (fairseq/optim/nag.py).

Not ``torch.optim.SGD(nesterov=True)``: fairseq keeps a momentum buffer that
already holds ``-lr * gradient`` terms, and when the scheduler changes the lr
between two steps it rescales the buffer by ``lr / lr_old`` so the momentum is
expressed at the new lr. That matches torch's rule while the lr stays positive,
but an update at lr 0 (a warmup from 0) empties fairseq's buffer where torch's
keeps the gradient, and fairseq's weight decay shrinks the weights by
``lr * weight_decay`` instead of adding L2 to the gradient. One step, with ``m`` the momentum, ``g`` the gradient
and ``c = lr / lr_old`` (``lr`` itself when ``lr_old`` is 0)::

    p   <- p * (1 - lr * weight_decay)
    p   <- p + m * m * c * buf - (1 + m) * lr * g
    buf <- m * c * buf - lr * g

``lr_old`` is kept in each param group, so it travels with the optimizer's
state dict. Parameters stored in fp16/bf16 (``--memory-efficient-fp16``) are
stepped in fp32 and written back; the momentum buffer is fp32.
"""
import dataclasses

import torch

from shardtrain.core.fields import field
from shardtrain.optim.optim_config import check_non_negative
from shardtrain.optim.registry import OptimizerSpec, register_optimizer

_LOW_PRECISION = (torch.float16, torch.bfloat16)


class NAG(torch.optim.Optimizer):
    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, lr_old=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        """One update from the gradients already computed (the trainer passes no closure)."""
        if closure is not None:
            raise ValueError("NAG.step takes no closure: compute the loss and gradients before calling it")
        for group in self.param_groups:
            lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
            lr_old = group.get("lr_old", lr)
            correction = lr / lr_old if lr_old > 0 else lr
            for p in group["params"]:
                if p.grad is not None:
                    self._step_param(p, lr, momentum, weight_decay, correction)
            group["lr_old"] = lr

    def _step_param(self, p, lr, momentum, weight_decay, correction) -> None:
        low = p.dtype in _LOW_PRECISION
        weights, grad = (p.float(), p.grad.float()) if low else (p, p.grad)
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(grad)
        buf = state["momentum_buffer"]
        if weight_decay != 0:
            weights.mul_(1 - lr * weight_decay)
        weights.add_(buf, alpha=momentum * momentum * correction)
        weights.add_(grad, alpha=-(1 + momentum) * lr)
        buf.mul_(momentum * correction).add_(grad, alpha=-lr)
        if weights is not p:
            p.copy_(weights)


@dataclasses.dataclass
class NAGConfig:
    momentum: float = field(0.99, help="momentum factor")
    weight_decay: float = field(0.0, help="weight decay")


@register_optimizer("nag", dataclass=NAGConfig)
def nag(cfg, device: torch.device) -> OptimizerSpec:
    check_non_negative(cfg, "momentum", "weight_decay")
    return OptimizerSpec(NAG, dict(momentum=cfg.momentum, weight_decay=cfg.weight_decay),
                         state_bytes=4)  # its fp32 momentum buffer, kept whatever the momentum
