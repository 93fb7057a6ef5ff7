"""``--optimizer adafactor``: fairseq's Adafactor, with fairseq's flags.

Written out rather than built on ``torch.optim.Adafactor``, which cannot express
fairseq's defaults: torch's always scales the step by the parameter's RMS and
caps it at 1/sqrt(t) (fairseq's --scale-parameter --relative-step, with --lr as
the cap), clamps the variance at eps1² where fairseq adds eps1 to grad², scales
weight decay by --lr instead of by the step size, and has no --beta1 or
--warmup-init. Mapped onto torch's, every fairseq run would either change
meaning or be refused.

One deliberate difference from fairseq: fairseq writes each parameter's step
size into ``group["lr"]``, so with --scale-parameter (and no --relative-step)
the next parameter scales the already-scaled value, and the logged lr is the
last parameter's step size. Here the step size is per parameter and
``group["lr"]`` stays the scheduler's (as in Hugging Face's copy of this
optimizer). Every other flag combination computes what fairseq computes.

Under --ddp-backend fully_sharded each rank holds some rows (dim 0) of every
parameter (a DTensor). A row's mean is local, but a column's mean, the mean
row, and the RMS of the update and of the parameter span all rows: each rank
sums its part and one all-reduce per statistic group adds them (two per matrix
per step, one per other parameter), so the step is the unsharded one. The
state is DTensors laid out like its statistic (row means split with the rows,
column means whole on every rank), which checkpoints save and reshard like any
optimizer's. DTensor's own ops were not used for this: they replicate uneven
shards to take a mean, and cannot keep a row split narrower than the mesh.
"""
import dataclasses
import math
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from shardtrain.core.dtensors import is_dtensor, local_tensor
from shardtrain.core.fields import field
from shardtrain.core.torch_private import dtensor_where_it_is
from shardtrain.core.errors import ConfigError
from shardtrain.optim.optim_config import parse_float_tuple
from shardtrain.optim.registry import OptimizerSpec, register_optimizer


class Adafactor(torch.optim.Optimizer):
    """Adafactor (Shazeer and Stern, 2018) as fairseq implements it.

    A parameter of 2 or more dims keeps the running mean of grad² factored into
    row and column means over its last two dims; others keep it whole.
    ``beta1`` (None: off) adds a first moment. The step size is ``lr``, or with
    ``relative_step`` min(1e-2, 1/sqrt(t)) (min(1e-6 t, 1/sqrt(t)) with
    ``warmup_init``), times max(eps[1], RMS(param)) with ``scale_parameter``.
    """

    def __init__(self, params, lr: float, eps: Tuple[float, float] = (1e-30, 1e-3), clip_threshold: float = 1.0,
                 decay_rate: float = -0.8, beta1: Optional[float] = None, weight_decay: float = 0.0,
                 scale_parameter: bool = False, relative_step: bool = False, warmup_init: bool = False):
        assert not warmup_init or relative_step, "checked by the optimizer's config"
        defaults = dict(lr=lr, eps=tuple(eps), clip_threshold=clip_threshold, decay_rate=decay_rate, beta1=beta1,
                        weight_decay=weight_decay, scale_parameter=scale_parameter, relative_step=relative_step,
                        warmup_init=warmup_init)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                RowShards.of(p)  # refuses, up front, a sharding it cannot reduce over

    #: Multiplies the gradients of the next step() once they are fp32 (then resets to 1):
    #: the trainer's unscaling, 1/sample size and clipping, so fp16 gradients
    #: (--memory-efficient-fp16) are not unscaled in fp16, where small entries flush to zero.
    grad_multiplier = 1.0

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        multiplier, self.grad_multiplier = self.grad_multiplier, 1.0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group, multiplier)
        return loss

    def _update(self, p: torch.Tensor, group, multiplier: float = 1.0) -> None:
        shards = RowShards.of(p)
        # Statistics in fp32 even for fp16/bf16 parameters, as fairseq.
        grad = _at_least_fp32(local_tensor(p.grad))
        if multiplier != 1.0:
            grad = grad * multiplier
        param = _at_least_fp32(local_tensor(p))
        state = self.state[p]
        if not state:
            _init_state(state, p.grad, grad.dtype, group["beta1"] is not None)
        state["step"] += 1
        step = float(state["step"])
        beta2t = 1.0 - math.pow(step, group["decay_rate"])
        grad_sq = grad.square().add_(group["eps"][0])
        if p.dim() >= 2:
            update = grad * _inverse_sqrt_factored(state, grad_sq, beta2t, p.shape, shards)
        else:
            variance = local_tensor(state["exp_avg_sq"]).mul_(beta2t).add_(grad_sq, alpha=1.0 - beta2t)
            update = grad * variance.rsqrt()
        # One reduction for both sums of squares; the parameter's is only needed with --scale-parameter.
        squares = [update.square().sum(), param.square().sum() if group["scale_parameter"] else grad.new_zeros(())]
        update_sq, param_sq = shards.sum(squares)
        update = update / (_rms(update_sq, p.numel()) / group["clip_threshold"]).clamp(min=1.0)
        step_size = _step_size(group, step, _rms(param_sq, p.numel()))
        update = update * step_size
        if group["beta1"] is not None:
            update = local_tensor(state["exp_avg"]).mul_(group["beta1"]).add_(update, alpha=1.0 - group["beta1"])
        if group["weight_decay"] != 0:
            param = param - param * (group["weight_decay"] * step_size)
        local_tensor(p).copy_(param - update)


def _inverse_sqrt_factored(state, grad_sq: torch.Tensor, beta2t: float, shape, shards: "RowShards") -> torch.Tensor:
    """Update the row and column means of grad² and return the rsqrt of their
    outer product over the mean row: fairseq's estimate of 1/sqrt(E[grad²])."""
    row, col = local_tensor(state["exp_avg_sq_row"]), local_tensor(state["exp_avg_sq_col"])
    row.mul_(beta2t).add_(grad_sq.mean(dim=-1), alpha=1.0 - beta2t)  # a row is never split
    # Sums over rows (for the column means, and the mean row) cross ranks when a
    # 2-dim parameter's rows are split; a larger one is split along a batch dim.
    sums = [grad_sq.sum(dim=-2), row.sum(dim=-1, keepdim=True)]
    col_sum, row_sum = shards.sum(sums) if len(shape) == 2 else sums
    col.mul_(beta2t).add_(col_sum / shape[-2], alpha=1.0 - beta2t)
    row_factor = (row / (row_sum / shape[-2])).rsqrt().unsqueeze(-1)
    return row_factor * col.unsqueeze(-2).rsqrt()


def _init_state(state, grad: torch.Tensor, dtype: torch.dtype, first_moment: bool) -> None:
    # Tensors (DTensors for sharded parameters, laid out like their statistic)
    # so that checkpoints save and reshard them like any optimizer's state.
    state["step"] = torch.tensor(0.0)
    if first_moment:
        state["exp_avg"] = torch.zeros_like(grad, dtype=dtype)
    if grad.dim() >= 2:
        state["exp_avg_sq_row"] = _zeros_without_dim(grad, grad.dim() - 1, dtype)
        state["exp_avg_sq_col"] = _zeros_without_dim(grad, grad.dim() - 2, dtype)
    else:
        state["exp_avg_sq"] = torch.zeros_like(grad, dtype=dtype)


def _zeros_without_dim(like: torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Zeros shaped like ``like`` without ``dim``. For a DTensor split by rows:
    split the same way, or whole on every rank when ``dim`` is the split dim 0."""
    shape = like.shape[:dim] + like.shape[dim + 1:]
    if not is_dtensor(like):
        return like.new_zeros(shape, dtype=dtype)
    from torch.distributed.tensor import Replicate  # loaded: ``like`` is a DTensor
    local = like.to_local()
    placements, local_shape = like.placements, local.shape[:dim] + local.shape[dim + 1:]
    if dim == 0:
        placements, local_shape = [Replicate()] * like.device_mesh.ndim, shape
    # Not DTensor.from_local: it would move a --cpu-offload shard (host memory) to the mesh's GPU.
    return dtensor_where_it_is(local.new_zeros(local_shape, dtype=dtype), like.device_mesh, placements, shape)


def _step_size(group, step: float, param_rms: torch.Tensor):
    """A float, or a 0-dim tensor with --scale-parameter (no host sync for the RMS)."""
    size = group["lr"]
    if group["relative_step"]:
        ceiling = 1e-6 * step if group["warmup_init"] else 1e-2
        # lr 0 still means no update: torch.distributed.checkpoint steps with lr 0
        # to create the state it loads into, and must not move the weights.
        size = min(ceiling, 1.0 / math.sqrt(step)) if group["lr"] != 0 else 0.0
    if group["scale_parameter"]:
        return param_rms.clamp(min=group["eps"][1]) * size
    return size


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


@dataclasses.dataclass(frozen=True)
class RowShards:
    """The ranks a parameter's rows (dim 0) are split over, as FSDP2 splits them;
    ``group`` is None for a whole tensor (or a split over one rank)."""

    group: Optional[dist.ProcessGroup] = None
    device_type: str = "cpu"

    @staticmethod
    def of(p: torch.Tensor) -> "RowShards":
        if not is_dtensor(p):
            return RowShards()
        from torch.distributed.tensor import Replicate, Shard  # loaded: ``p`` is a DTensor
        split = [i for i, placement in enumerate(p.placements) if not isinstance(placement, Replicate)]
        if len(split) > 1 or any(not (type(p.placements[i]) is Shard and p.placements[i].dim == 0) for i in split):
            raise ConfigError(
                f"--optimizer adafactor computes its statistics over whole rows and columns, and can combine "
                f"them across ranks only for parameters split by rows, as --ddp-backend fully_sharded splits "
                f"them; a parameter of shape {tuple(p.shape)} is laid out as {p.placements}. Use --ddp-backend "
                f"fully_sharded or pytorch_ddp, or a pointwise optimizer such as adam.")
        if not split or p.device_mesh.size(split[0]) == 1:
            return RowShards()
        return RowShards(p.device_mesh.get_group(split[0]), p.device_mesh.device_type)

    def sum(self, tensors: List[torch.Tensor]) -> List[torch.Tensor]:
        """Each tensor summed over the ranks, in one all-reduce."""
        if self.group is None:
            return tensors
        flat = torch.cat([t.reshape(-1) for t in tensors])
        # --cpu-offload keeps shards on the CPU, and NCCL reduces only GPU tensors.
        on_mesh = flat.to(self.device_type)
        dist.all_reduce(on_mesh, group=self.group)
        flat = on_mesh.to(flat.device)
        return [part.view_as(t) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors)]


def _rms(sum_of_squares: torch.Tensor, numel: int) -> torch.Tensor:
    return (sum_of_squares / numel).sqrt()


@dataclasses.dataclass
class AdafactorConfig:
    adafactor_eps: Tuple[float, float] = field(
        (1e-30, 1e-3), help="epsilons for Adafactor optimizer: added to grad², and the least parameter RMS "
        "--scale-parameter scales by")
    clip_threshold: float = field(1.0, help="threshold for clipping update root mean square")
    decay_rate: float = field(-0.8, help="decay rate of the second moment estimator")
    beta1: Optional[float] = field(None, help="beta for first moment estimator. Optional")
    weight_decay: float = field(0.0, help="weight decay, scaled by the step size", aliases=("--wd",))
    scale_parameter: bool = field(False, help="scale learning rate by root mean square of parameter")
    relative_step: bool = field(
        False, help="set learning rate to inverse square root of timestep (capped at 1e-2), otherwise use "
        "external learning rate; --lr and the lr scheduler are then not used")
    warmup_init: bool = field(False, help="use relative step for warm-up learning rate schedule "
                              "(min(1e-6 * step, 1/sqrt(step)); needs --relative-step)")


@register_optimizer("adafactor", dataclass=AdafactorConfig, supports_memory_efficient_fp16=True)
def adafactor(cfg, device: torch.device) -> OptimizerSpec:
    eps = parse_float_tuple(cfg.adafactor_eps, "--adafactor-eps", (1e-30, 1e-3))
    _check(cfg, eps)
    return OptimizerSpec(Adafactor, dict(
        eps=eps, clip_threshold=cfg.clip_threshold, decay_rate=cfg.decay_rate, beta1=cfg.beta1,
        weight_decay=cfg.weight_decay, scale_parameter=cfg.scale_parameter, relative_step=cfg.relative_step,
        warmup_init=cfg.warmup_init), state_bytes=4 if cfg.beta1 else 0)  # the factored moment is negligible


def _check(cfg, eps: Tuple[float, float]) -> None:
    problems = []
    if cfg.warmup_init and not cfg.relative_step:
        problems.append("--warmup-init warms up the relative step size and needs --relative-step; add "
                        "--relative-step or drop --warmup-init (an external warmup is --lr-scheduler's job).")
    if min(eps) < 0:
        problems.append(f"--adafactor-eps {eps} must be two non-negative numbers, e.g. '(1e-30, 1e-3)'.")
    if cfg.clip_threshold <= 0:
        problems.append(f"--clip-threshold is {cfg.clip_threshold}; it must be > 0 (fairseq's default is 1.0).")
    if cfg.decay_rate > 0:
        problems.append(f"--decay-rate is {cfg.decay_rate}; it must be <= 0 (beta2 at step t is 1 - t^decay_rate; "
                        "fairseq's default is -0.8).")
    if cfg.beta1 is not None and not 0.0 <= cfg.beta1 < 1.0:
        problems.append(f"--beta1 is {cfg.beta1}; it must be in [0, 1), or left out for no first moment.")
    if cfg.weight_decay < 0:
        problems.append(f"--weight-decay is {cfg.weight_decay}, but it must be >= 0.")
    if problems:
        raise ConfigError(" ".join(problems))
