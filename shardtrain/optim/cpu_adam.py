"""``--optimizer cpu_adam``: Adam whose state and update live in CPU memory.

fairseq's FSDP recipe (``--ddp-backend fully_sharded --cpu-offload --optimizer
cpu_adam``) steps the optimizer on the CPU, where CPU offload keeps the
parameter shards. fairseq calls DeepSpeed's CPU Adam for this; torch's fused
CPU Adam kernel is as fast (benchmarks/cpu_adam.py), so :class:`CPUAdam` drives
that kernel through torch's public functional API. A parameter is stepped one
of three ways:

* fused: an fp32 parameter on the CPU (a plain tensor, or a DTensor whose
  local shard is on the CPU) with fp32 state. A group's such parameters go
  through one fused call on the DTensors' local tensors: no DTensor dispatch
  per step, and writing into a local tensor is writing into its DTensor.
* chunked: fp16/bf16 parameters (fp32 state), or ``--fp16-adam-stats``. Each
  tensor is stepped in chunks of ``_CHUNK_NUMEL`` elements upcast to fp32, so
  the temporary memory stays bounded whatever the model size.
* master copy: parameters on another device (e.g. CUDA; DeepSpeed's CPU Adam
  used on its own). An fp32 master copy and the state stay on the CPU; each
  chunk's gradient is copied to the CPU, stepped, and copied back, overlapped
  with the stepping (pinned double buffers: :mod:`shardtrain.optim.chunk_pipe`).

``--fp16-adam-stats`` keeps the moments in fp16 (:mod:`shardtrain.optim.fp16_adam_stats`); such
parameters take the chunked path, which converts each chunk's moments to fp32 and back.
"""
import dataclasses
import itertools
from typing import Dict, List, Optional

import torch
from torch.optim.adam import adam as functional_adam

from shardtrain.core.dtensors import is_dtensor, local_tensor
from shardtrain.core.fields import field
from shardtrain.core.errors import CheckpointError, ConfigError
from shardtrain.optim import fp16_adam_stats
from shardtrain.optim.chunk_pipe import ChunkPipe
from shardtrain.optim.optim_config import AdamConfig, check_non_negative, parse_betas
from shardtrain.optim.registry import OptimizerSpec, register_optimizer

# 1M elements: a chunk's fp32 scratch (4 x 4 MB) stays in a typical L3 cache from
# the upcast through the kernel to the write-back; measured 1.5-1.8x faster than
# 16M-element chunks on the fp16-stats and bf16-parameter paths.
_CHUNK_NUMEL = 1 << 20
_TENSOR_KEYS = fp16_adam_stats.FP32_KEYS + fp16_adam_stats.FP16_KEYS + ("master_param",)


class CPUAdam(torch.optim.Optimizer):
    """Adam/AdamW with its state in CPU memory; see the module docstring.

    ``adamw_mode=True`` decays weights decoupled from the gradient (AdamW),
    ``False`` adds ``weight_decay * param`` to the gradient (torch's Adam).
    ``_master_copy=True`` forces the master-copy path for CPU parameters too
    (it is chosen automatically for parameters on other devices); tests use it.
    """

    kernel = "fused CPU Adam"  # what the optimizer log line names (torch optimizers: their fused/foreach flag)
    steps_on_host = True  # trainer/parallel/step_in_backward.py may step it shard by shard during backward

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, adamw_mode: bool = True, fp16_adam_stats: bool = False,
                 _master_copy: bool = False):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        adamw_mode=adamw_mode, fp16_adam_stats=fp16_adam_stats)
        super().__init__(params, defaults)
        self._force_master_copy = _master_copy
        #: Multiplies the gradients of the next step() as the kernel reads them, in fp32 (then
        #: resets to 1): the trainer's unscaling, 1/sample size and clipping cost no pass of
        #: their own, and fp16 gradients (--memory-efficient-fp16) are not unscaled in fp16,
        #: where their small entries would flush to zero.
        self.grad_multiplier = 1.0
        for p in itertools.chain.from_iterable(g["params"] for g in self.param_groups):
            if is_dtensor(p) and local_tensor(p).device.type != "cpu":
                raise ConfigError(
                    f"--optimizer cpu_adam got parameters sharded on {local_tensor(p).device.type}: their optimizer "
                    "state would be kept per rank outside the sharded checkpoint. Add --cpu-offload so the "
                    "shards live on the CPU, or use --optimizer adam to step on the accelerator.")

    def __setstate__(self, state):
        super().__setstate__(state)
        # A loaded group (e.g. torch.optim.AdamW's, on switching to cpu_adam) may lack our keys.
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    def _uses_master_copy(self, p: torch.Tensor) -> bool:
        return self._force_master_copy or local_tensor(p).device.type != "cpu"

    def _fill_state(self, p: torch.Tensor, group) -> Dict:
        """Create whatever state ``p`` lacks (all of it on the first step; the
        master copy after loading a checkpoint that had none)."""
        state = self.state[p]
        state.setdefault("step", torch.zeros((), dtype=torch.float32))
        master = self._uses_master_copy(p)
        if master and "master_param" not in state:
            state["master_param"] = local_tensor(p).detach().to("cpu", torch.float32, copy=True).contiguous()
        keys, dtype = fp16_adam_stats.moment_keys(group["fp16_adam_stats"])
        for key in keys:
            if key not in state:
                # Master-copy state is one plain CPU tensor; otherwise the state is
                # laid out like the parameter (a DTensor for a DTensor parameter).
                state[key] = (torch.zeros(local_tensor(p).shape, dtype=dtype) if master
                              else torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format))
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        multiplier, self.grad_multiplier = self.grad_multiplier, 1.0
        for group in self.param_groups:
            fused, chunked = [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("CPUAdam does not support sparse gradients")
                state = self._fill_state(p, group)
                grad = local_tensor(p.grad)
                plain = "master_param" not in state and not group["fp16_adam_stats"]
                # The fused kernel walks the tensors' memory in step, so it needs one layout.
                same_kind = (local_tensor(p).dtype == grad.dtype == torch.float32 and grad.device.type == "cpu"
                             and local_tensor(p).is_contiguous() and grad.is_contiguous())
                (fused if plain and same_kind else chunked).append(p)
            self._step_fused(group, fused, multiplier)
            scratch, pipes = _Scratch(), {}
            for p in chunked:
                self._step_chunked(group, p, scratch, pipes, multiplier)
            for pipe in pipes.values():
                pipe.finish()
        return loss

    # -- one parameter at a time, for stepping during backward (trainer/parallel/step_in_backward.py) ----------
    def steps_fused(self, p: torch.Tensor) -> bool:
        """Whether :meth:`step` would step ``p`` through the fused kernel (fp32 on the CPU, fp32 state, no
        master copy): the only path whose result does not depend on which parameters share a call."""
        group = self._group_of(p)
        return (not group["fp16_adam_stats"] and not self._uses_master_copy(p)
                and local_tensor(p).dtype == torch.float32 and local_tensor(p).is_contiguous())

    @torch.no_grad()
    def step_one(self, p: torch.Tensor, multiplier: float, keep: bool, leave_grad: bool = True):
        """Step ``p`` alone with ``multiplier``, as :meth:`step` would step it with that multiplier (the
        fused kernel works tensor by tensor: grouping changes no bit). ``keep``: return what :meth:`restore`
        needs to undo the step exactly (the parameter, moments and step, copied). ``leave_grad``: the
        gradient is left as it was (the kernel writes the multiplied gradient back into what it reads, so it
        reads a copy); False lets it write into ``p.grad`` itself, as :meth:`step` does (no copy)."""
        group = self._group_of(p)
        fresh = not self.state.get(p)  # a first step creates the state: undoing it removes it again
        state = self._fill_state(p, group)
        kept = None
        if keep:
            kept = (fresh, local_tensor(p).clone()) + (() if fresh else tuple(
                t.clone() for t in (local_tensor(state["exp_avg"]), local_tensor(state["exp_avg_sq"]), state["step"])))
        grad = local_tensor(p.grad)
        if leave_grad and multiplier != 1.0:  # the kernel would leave grad/scale in the gradient: it reads a copy
            grad = self._grad_copy(grad)
        self._step_fused(group, [p], multiplier, grads=[grad])
        return kept

    def _grad_copy(self, grad: torch.Tensor) -> torch.Tensor:
        """``grad`` copied into one buffer kept for this (the largest gradient stepped so far): a fresh tensor per
        parameter costs its page faults too, 2-3x the copy itself."""
        buffer = getattr(self, "_grad_buffer", None)
        if buffer is None or buffer.numel() < grad.numel():
            buffer = self._grad_buffer = torch.empty(grad.numel(), dtype=grad.dtype)
        return buffer[:grad.numel()].view(grad.shape).copy_(grad)

    def _group_of(self, p: torch.Tensor) -> Dict:
        """``p``'s param group. Looked up in a map, rebuilt whenever its group is no longer one of
        ``param_groups`` (load_state_dict replaces the group dicts: a stale one would step with a stale lr)."""
        group = getattr(self, "_groups_by_param", {}).get(id(p))
        if group is None or not any(group is g for g in self.param_groups):
            self._groups_by_param = {id(q): g for g in self.param_groups for q in g["params"]}
            group = self._groups_by_param[id(p)]
        return group

    @torch.no_grad()
    def restore(self, p: torch.Tensor, kept) -> None:
        """Undo :meth:`step_one` on ``p`` from what it kept: bit for bit."""
        fresh, param, *moments = kept
        local_tensor(p).copy_(param)
        if fresh:
            del self.state[p]
            return
        state = self.state[p]
        targets = (local_tensor(state["exp_avg"]), local_tensor(state["exp_avg_sq"]), state["step"])
        for target, value in zip(targets, moments):
            target.copy_(value)

    def _step_fused(self, group, params: List[torch.Tensor], multiplier: float,
                    grads: Optional[List[torch.Tensor]] = None) -> None:
        """``grads``: what the kernel reads as the gradients (default: each ``.grad``, which it overwrites
        with the multiplied gradient)."""
        if not params:
            return
        states = [self.state[p] for p in params]
        # The kernel divides each gradient by grad_scale as it reads it: the multiplier costs
        # no pass of its own over the gradients (benchmarks/offload_step.py).
        grad_scale = None if multiplier == 1.0 else torch.tensor(1.0 / multiplier)
        grads = [local_tensor(p.grad) for p in params] if grads is None else grads
        _adam(group, [local_tensor(p) for p in params], grads,
              [local_tensor(s["exp_avg"]) for s in states], [local_tensor(s["exp_avg_sq"]) for s in states],
              [s["step"] for s in states], grad_scale)

    def _step_chunked(self, group, p: torch.Tensor, scratch: "_Scratch", pipes: Dict, multiplier: float) -> None:
        """Step one tensor chunk by chunk in fp32 scratch buffers; tensors that
        are fp32 and on the CPU already are used in place. ``pipes``: a ChunkPipe per device."""
        state = self.state[p]
        fp16 = group["fp16_adam_stats"]
        master = state.get("master_param")
        target = local_tensor(p)
        param = master if master is not None else target
        moments = [local_tensor(state[k]) for k in fp16_adam_stats.moment_keys(fp16)[0]]
        tensors = [param, local_tensor(p.grad), *moments]
        numel = target.numel()
        # A non-contiguous tensor has no flat view to chunk: step it whole.
        whole = not all(t.is_contiguous() for t in tensors + [target])
        chunk = max(numel, 1) if whole else _CHUNK_NUMEL
        starts = range(0, numel, chunk)

        def chunks(t, start):
            return t if whole else t.view(-1)[start:start + chunk]

        device = target.device if master is not None else torch.device("cpu")
        pipe = pipes[device] = pipes.get(device) or ChunkPipe(device)
        if starts:
            pipe.fetch(0, chunks(tensors[1], 0))
        step = torch.empty_like(state["step"])
        for i, start in enumerate(starts):
            if i + 1 < len(starts):  # chunk i+1's gradient travels while chunk i is stepped
                pipe.fetch(i + 1, chunks(tensors[1], starts[i + 1]))
            views = [chunks(t, start) for t in tensors + [target]]
            views[1] = pipe.take(i)
            bufs = [scratch.fp32(slot, v) for slot, v in enumerate(views[:4])]
            if multiplier != 1.0:
                bufs[1].mul_(multiplier)
            if fp16:
                fp16_adam_stats.unpack(bufs[2], bufs[3])
            step.copy_(state["step"])  # the functional API advances it once per call
            _adam(group, [bufs[0]], [bufs[1]], [bufs[2]], [bufs[3]], [step])
            if fp16:
                fp16_adam_stats.pack(bufs[2], bufs[3], views[2], views[3])
            if master is not None:
                pipe.put(i, views[4], bufs[0])
            elif bufs[0] is not views[0]:
                views[0].copy_(bufs[0])  # rounds to the parameter's fp16/bf16
        state["step"].add_(1)

    def load_state_dict(self, state_dict) -> None:
        """torch's loading casts floating-point state to the parameter's dtype and
        device; this optimizer keeps fp32 (or fp16-stats) state on the CPU, so the
        state tensors are placed here instead. This run's --fp16-adam-stats wins
        over the saved one: the saved moments are converted to its storage."""
        saved_state = state_dict["state"]
        kept_flags = [g["fp16_adam_stats"] for g in self.param_groups]
        rest = {k: {n: v for n, v in s.items() if n not in _TENSOR_KEYS} for k, s in saved_state.items()}
        super().load_state_dict({**state_dict, "state": rest})
        saved_ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
        for group, fp16 in zip(self.param_groups, kept_flags):
            group["fp16_adam_stats"] = fp16
            for p, saved_id in zip(group["params"], saved_ids):
                if saved_id in saved_state:
                    self._load_param_state(p, group, saved_state[saved_id])

    def _load_param_state(self, p: torch.Tensor, group, saved: Dict) -> None:
        state = self.state[p]
        if "step" in state:
            state["step"] = torch.as_tensor(state["step"], dtype=torch.float32).detach().to("cpu", copy=True)
        master = self._uses_master_copy(p)
        shape = local_tensor(p).shape if master else p.shape
        moments = fp16_adam_stats.convert_moments(saved, group["fp16_adam_stats"])
        if master and "master_param" in saved:
            moments["master_param"] = saved["master_param"].to(torch.float32)
        for key, value in moments.items():
            if value.shape != shape:
                raise CheckpointError(
                    f"The optimizer state {key!r} in the checkpoint has shape {tuple(value.shape)}, but its "
                    f"parameter has shape {tuple(shape)}: the checkpoint was saved for another model or "
                    "sharding. Resume from a checkpoint of this model, or pass --reset-optimizer to start the "
                    "optimizer afresh.")
            state[key] = value.to("cpu").contiguous()


def _adam(group, params, grads, exp_avgs, exp_avg_sqs, steps, grad_scale=None) -> None:
    beta1, beta2 = group["betas"]
    functional_adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, fused=True, grad_scale=grad_scale,
                    decoupled_weight_decay=group["adamw_mode"], amsgrad=False, beta1=beta1, beta2=beta2,
                    lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)


class _Scratch:
    """fp32 CPU buffers reused by every chunk of one step, so stepping a
    large model allocates at most one chunk-sized buffer per operand."""

    def __init__(self):
        self._buffers: Dict[int, torch.Tensor] = {}

    def fp32(self, slot: int, view: torch.Tensor) -> torch.Tensor:
        """``view`` itself if it is contiguous fp32 on the CPU, else an fp32 CPU copy of it."""
        if view.dtype == torch.float32 and view.device.type == "cpu" and view.is_contiguous():
            return view
        buffer: Optional[torch.Tensor] = self._buffers.get(slot)
        if buffer is None or buffer.numel() < view.numel():
            buffer = self._buffers[slot] = torch.empty(view.numel(), dtype=torch.float32)
        return buffer[:view.numel()].view(view.shape).copy_(view)


@dataclasses.dataclass
class CPUAdamConfig(AdamConfig):
    fp16_adam_stats: bool = field(
        False, help="keep Adam's moments in fp16 (exp_avg and sqrt(exp_avg_sq), times 2**10): 4 bytes "
        "per parameter less optimizer state, for updates ~0.4 percent off fp32 moments' after 1000 steps")


@register_optimizer("cpu_adam", dataclass=CPUAdamConfig, supports_memory_efficient_fp16=True)
def cpu_adam(cfg, device: torch.device) -> OptimizerSpec:
    """fairseq's ``cpu_adam``: the optimizer steps in CPU memory (fused kernel)."""
    check_non_negative(cfg, "adam_eps", "weight_decay")
    return OptimizerSpec(CPUAdam, dict(betas=parse_betas(cfg.adam_betas, "--adam-betas"), eps=cfg.adam_eps,
                                       weight_decay=cfg.weight_decay, adamw_mode=cfg.adamw_mode,
                                       fp16_adam_stats=cfg.fp16_adam_stats),
                         state_bytes=4 if cfg.fp16_adam_stats else 8, steps_on_cpu=True)


def for_fp16_parameters(spec: OptimizerSpec) -> OptimizerSpec:
    """``--optimizer adam --memory-efficient-fp16``: torch's Adam/AdamW would keep fp16 moments for
    fp16 parameters; :class:`CPUAdam` with the same arguments keeps them in fp32 and steps in fp32, as
    fairseq's adam does for fp16 parameters (its supports_memory_efficient_fp16). Other specs are kept."""
    if spec.cls not in (torch.optim.Adam, torch.optim.AdamW):
        return spec
    kwargs = {k: v for k, v in spec.kwargs.items() if k not in ("fused", "foreach")}
    return OptimizerSpec(CPUAdam, dict(kwargs, adamw_mode=spec.cls is torch.optim.AdamW),
                         state_bytes=spec.state_bytes, steps_on_cpu=True)
