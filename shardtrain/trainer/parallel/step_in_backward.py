"""The CPU optimizer steps each parameter shard during backward, as soon as its gradient is on the host.

Under ``--ddp-backend fully_sharded --cpu-offload --optimizer cpu_adam`` the shards, their gradients and Adam's
state live in host memory. Stepped after backward, the CPU step (about 36 bytes of memory traffic per parameter)
leaves the accelerator idle; stepped here, a worker thread steps block N's shards while the accelerator runs
block N-1's backward, and only the last block's (FSDP's root group: embeddings, the output projection) steps
after backward.

When: FSDP2 calls a sharded parameter's post-accumulate-grad hooks itself, right after it has put the reduced
gradient on the host (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, ``foreach_reduce``), once per
parameter and only on the update's last micro-batch (``arm``). On an accelerator the hook records an event on
the current stream, which the worker waits for: torch 2.13 copies such a gradient synchronously, torch 2.11
may still be copying it (non_blocking into pinned memory) when the hook runs.

Exactness: the update is multiplied by unscale x ranks / sample size (known before backward) and, where
``--clip-norm`` fires, by clip / norm, which needs every gradient. The worker steps with the first
(speculates that clipping will not fire) and keeps a copy of each shard's parameter and moments (``keep``);
after backward the trainer takes the norm, then commits, or restores every shard bit for bit and steps
synchronously (clipped), or restores and skips (an fp16 overflow, ``--skip-nan-updates``). The fused kernel
steps tensor by tensor, so stepping one shard at a time gives the bits of one call over all of them.

The norm: the worker takes each shard's gradient norm before stepping it, and :meth:`grad_norm` reduces them
as ``get_total_norm`` and DTensor reduce the gradients' own (same bits: torch's ops on each local shard's
norm wrapped as a partial norm). So the worker may let the fused kernel write
the multiplied gradient back into the gradient it reads, as the synchronous step does: no copy. Where no
outcome but "commit" is possible (no clipping, a precision that never skips: a non-finite norm ends the run),
nothing is kept and nothing copied; otherwise the kept state (12 bytes a parameter) and the pristine gradient
that a clipped redo steps again (the worker steps a copy of it, through one reused buffer) cost their traffic.
"""
import logging
import queue
import threading
import time
from typing import Callable, Dict, List, Optional

import torch
from torch.distributed.tensor import DTensor

from shardtrain.core.torch_private import total_norm_of_shards
from shardtrain.trainer.parallel.host_norms import local_norms

logger = logging.getLogger(__name__)


def build_step_in_backward(cfg, backend, optimizer, params, precision, clock=None, before_stepping=None,
                           after_because: Optional[str] = None) -> Optional["StepInBackward"]:
    """The run's :class:`StepInBackward`, or None where the optimizer steps after backward, said once.
    ``after_because``: the run's facts' reason to step after backward (``RunFacts.cpu_step_after_backward``, the
    one decision, which shard-plan prices too), None where they say during it; ``clock``: a
    trainer/offload_times.StepClock the worker adds its work and waits to; ``before_stepping``: what the worker
    calls before its first step of an update (the trainer's: wait until a background save's write of the live
    state has landed)."""
    why = after_because or StepInBackward.unsupported(optimizer, params)  # the latter: what no fact says
    if why is not None:
        logger.info(f"the optimizer steps after backward, not during it: {why}")
        return None
    keep = cfg.optimization.clip_norm > 0 or precision.may_skip()
    logger.info("the optimizer steps each shard during backward, as its gradient reaches the host"
                + (" (keeping a copy of each shard's state until the update is decided: --clip-norm, fp16 or "
                   "--skip-nan-updates may undo it)" if keep else ""))
    return StepInBackward(optimizer, params, keep, backend.device, clock, before_stepping)


class StepInBackward:
    """Steps ``optimizer`` (a :class:`~shardtrain.optim.cpu_adam.CPUAdam`) shard by shard during backward.

    Per update: :meth:`arm` before the last micro-batch's backward, :meth:`finish` after it (joins the worker),
    then :meth:`commit` (the step stands; the shards no hook reached step now) or :meth:`undo`."""

    def __init__(self, optimizer, params: List[torch.nn.Parameter], keep: bool, device: torch.device,
                 clock=None, before_stepping: Optional[Callable[[], object]] = None):
        """``device``: the run's; where it is an accelerator, a gradient's copy to the host is waited for.
        ``before_stepping``: called by the worker before it steps anything of an update. The optimizer's own
        step pre-hooks do not run for a shard stepped alone: whatever must hold the state still until then
        (``--async-save`` writing the live state in the background) is waited for here."""
        self.optimizer = optimizer
        self.clock = clock
        self.before_stepping = before_stepping
        self._event_type = None if device.type == "cpu" else device.type
        self.params = params
        self.keep = keep
        self._multiplier: Optional[float] = None
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._worker: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._kept: Dict[torch.nn.Parameter, tuple] = {}
        self._norms: Dict[torch.nn.Parameter, torch.Tensor] = {}  # each stepped shard's gradient norm
        self._stepped: List[torch.nn.Parameter] = []
        self._handles = [p.register_post_accumulate_grad_hook(self._arrived) for p in params]

    @staticmethod
    def unsupported(optimizer, params) -> Optional[str]:
        """Why the shards cannot be stepped during backward (None: they can)."""
        if not hasattr(optimizer, "step_one"):
            return f"{type(optimizer).__name__} steps all parameters at once"
        if not all(optimizer.steps_fused(p) for p in params):
            return "some parameters step chunk by chunk (--fp16-adam-stats, or not fp32 on the CPU)"
        layouts = {(p.device_mesh, p.placements) if isinstance(p, DTensor) else None for p in params}
        if len(layouts) != 1 or None in layouts or sum(q.is_shard() for q in next(iter(layouts))[1]) != 1:
            return "the parameters are not all sharded alike on one mesh dimension (the gradient norm is " \
                   "taken from per-shard norms reduced over it)"
        return None

    def arm(self, multiplier: float) -> None:
        """The next backward is the update's last: step each shard as its gradient lands, with ``multiplier``."""
        self._multiplier = multiplier
        self._worker = threading.Thread(target=self._work, name="step-in-backward", daemon=True)
        self._worker.start()

    def _arrived(self, p: torch.nn.Parameter) -> None:
        if self._multiplier is None:  # an earlier micro-batch: its gradient is not the update's yet
            return
        event = None
        if self._event_type is not None:
            event = torch.Event(self._event_type)  # records on the current stream: after the copy to the host
            event.record()
        self._queue.put((p, event))

    def _work(self) -> None:
        ended = False
        try:
            if self.before_stepping is not None:
                self.before_stepping()
            with torch.no_grad():  # grad mode is per thread
                while not ended:
                    batch, ended = self._take()
                    self._step(batch)
        except BaseException as e:  # re-raised by finish(), on the training thread
            self._error = e
            while not ended and self._queue.get() is not None:
                pass

    def _take(self):
        """([(shard, event)...] handed over by now, at least one unless the update ended; whether it ended). FSDP2
        hands a block's shards over together: their norms are taken side by side (host_norms)."""
        batch, item = [], self._queue.get()
        while item is not None:
            batch.append(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False
        return batch, True

    def _step(self, batch) -> None:
        start = time.perf_counter()
        for p, event in batch:
            if event is not None:
                event.synchronize()
        if batch and batch[0][1] is not None:
            waited = time.perf_counter()
            if self.clock is not None:
                self.clock.waited(waited - start)
            start = waited
        params = [p for p, _ in batch]
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
        for p, norm in zip(params, local_norms(grads)):  # before the kernel writes the gradients back
            self._norms[p] = norm
        for p in params:
            kept = self.optimizer.step_one(p, self._multiplier, self.keep, leave_grad=self.keep)
            self._stepped.append(p)
            if self.keep:
                self._kept[p] = kept
        if batch and self.clock is not None:
            self.clock.worked(start, time.perf_counter())

    def finish(self) -> None:
        """Wait until every shard the hooks handed over is stepped."""
        if self._worker is None:
            return
        self._queue.put(None)
        self._worker.join()
        self._worker, self._multiplier = None, None
        if self._error is not None:
            error, self._error = self._error, None
            if self.keep:
                self.undo()
            else:  # nothing to restore from: the run stops with the worker's error, not undo()'s refusal
                self._forget()
            raise error

    def grad_norm(self) -> torch.Tensor:
        """The norm of the whole (unsharded) gradient, bit for bit what the backend's ``grad_norm`` takes of
        the gradients as they were before the worker stepped them (after :meth:`finish`)."""
        norms = []
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None:
                    norm = self._norms.get(p)
                    norms.append(_shard_norm(p) if norm is None else norm)  # no hook reached it: still pristine
            if not norms:
                return torch.zeros(())
            if not isinstance(self.params[0], DTensor):  # plain tensors (tests): get_total_norm's own recipe
                return torch.linalg.vector_norm(torch.stack(norms), 2.0)
            return total_norm_of_shards(norms, self.params[0])

    def abandon(self) -> None:
        """The update failed before it was decided: end the worker, and undo its steps where copies were kept."""
        try:
            self.finish()
        finally:
            if self.keep:
                self.undo()
            self._forget()

    def commit(self, multiplier: float) -> None:
        """The update stands with ``multiplier`` (the one armed with): step the shards with a gradient that no
        hook handed over (none under FSDP2; kept for safety, stepped exactly as the worker would)."""
        stepped = {id(p) for p in self._stepped}
        with torch.no_grad():
            for p in self.params:
                if p.grad is not None and id(p) not in stepped:
                    self.optimizer.step_one(p, multiplier, False, leave_grad=False)
        self._forget()

    def undo(self) -> None:
        """Put every stepped shard back as it was before the update, bit for bit."""
        if self._stepped and not self.keep:
            raise RuntimeError("StepInBackward was built without copies (keep=False): an update it stepped "
                               "cannot be undone")
        with torch.no_grad():
            for p in reversed(self._stepped):
                self.optimizer.restore(p, self._kept[p])
        self._forget()

    def _forget(self) -> None:
        self._stepped, self._kept, self._norms = [], {}, {}

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def _shard_norm(p: torch.nn.Parameter) -> torch.Tensor:
    """The 2-norm of this rank's shard of ``p.grad``: what ``get_total_norm`` takes of it (torch._foreach_norm
    on the CPU is linalg.vector_norm tensor by tensor)."""
    grad = p.grad
    return torch.linalg.vector_norm(grad.to_local() if isinstance(grad, DTensor) else grad, 2.0)
