"""When the optimizer steps, chosen once per run (as the backends are), so the Trainer's step reads the same
whichever it has: after backward (``StepAfterBackward``); after backward with its time split where the optimizer
steps in host memory (``TimedStepAfterBackward``: trainer/offload_times.py); or each shard during the last
backward (``StepDuringBackward``: trainer/parallel/step_in_backward.py). ``RunFacts.cpu_step_after_backward``
decides between the last two, as it does for shard-plan.

Per update the Trainer calls, in this order: ``backward()`` around forward/backward (``last_backward`` before the
last micro-batch's), ``stepping()`` around the decision and step, in it ``grad_norm`` and then one of ``step``,
``skip`` or ``stop`` (the run ends: NaN/inf), and ``fields`` for the record.
"""
import contextlib
from typing import Callable, Dict, Optional

from shardtrain.trainer.offload_times import OffloadTimes, StepClock
from shardtrain.trainer.parallel.step_in_backward import build_step_in_backward


class StepAfterBackward:
    """The optimizer steps once backward has ended, through the precision (on the device, or a whole model)."""
    times: Optional[OffloadTimes] = None
    step_in_backward = None

    def __init__(self, backend, optimizer, params, precision):
        self.backend, self.optimizer, self.params, self.precision = backend, optimizer, params, precision

    @contextlib.contextmanager
    def backward(self):
        yield

    def last_backward(self, multiplier: float) -> None:
        """The next backward is the update's last; ``multiplier``: the unclipped one (Trainer._multiplier)."""

    def stepping(self):
        return contextlib.nullcontext()

    def grad_norm(self):
        return self.backend.grad_norm(self.params)

    def step(self, multiplier: float, clipped: bool) -> None:
        self.precision.step(self.optimizer, self.backend, self.params, multiplier)

    def skip(self) -> None:
        """The update is skipped (an fp16 overflow, --skip-nan-updates)."""

    def stop(self) -> None:
        """The run stops (NaN/inf): nothing was stepped yet."""

    def fields(self) -> Dict:
        return {}

    def close(self) -> None:
        pass


class TimedStepAfterBackward(StepAfterBackward):
    """After backward, the optimizer stepping in host memory beside sharded parameters: each record splits the
    update's time (the ``offload_*`` fields)."""

    def __init__(self, backend, optimizer, params, precision, times: OffloadTimes):
        super().__init__(backend, optimizer, params, precision)
        self.times = times

    @contextlib.contextmanager
    def backward(self):
        self.times.begin()
        yield
        self.times.backward_done()

    def stepping(self):
        return self.times.stepping()

    def fields(self) -> Dict:
        return {"offload": self.times.fields()}

    def close(self) -> None:
        self.times.close()


class StepDuringBackward(TimedStepAfterBackward):
    """Each shard steps during the last backward, speculating that clipping will not fire; the update is then
    committed, or undone and stepped again clipped, or undone and skipped."""

    def __init__(self, backend, optimizer, params, precision, times: OffloadTimes, step_in_backward):
        super().__init__(backend, optimizer, params, precision, times)
        self.step_in_backward = step_in_backward

    @contextlib.contextmanager
    def backward(self):
        self.times.begin()
        try:
            yield
            self.times.backward_done()
        except BaseException:
            # an error in forward/backward: the worker ends, its steps undone where kept
            self.step_in_backward.abandon()
            raise
        self.step_in_backward.finish()  # every shard handed over is stepped with the multiplier, its norm taken first

    def last_backward(self, multiplier: float) -> None:
        self.step_in_backward.arm(multiplier)

    def grad_norm(self):
        return self.step_in_backward.grad_norm()  # its worker may have written the multiplied gradients back

    def step(self, multiplier: float, clipped: bool) -> None:
        if not clipped:
            self.step_in_backward.commit(multiplier)  # stepped during backward with this multiplier
        else:
            self.step_in_backward.undo()  # speculated unclipped: step again, clipped
            super().step(multiplier, clipped)

    def skip(self) -> None:
        self.step_in_backward.undo()  # a skipped update leaves no trace

    def stop(self) -> None:
        if self.step_in_backward.keep:  # leave the weights as they were where that is possible
            self.step_in_backward.undo()

    def close(self) -> None:
        self.step_in_backward.close()
        super().close()


def choose_optimizer_step(cfg, facts, backend, model, optimizer, params, precision,
                          before_stepping: Callable[[], object]) -> StepAfterBackward:
    """The run's way of stepping, from its facts (trainer/run_facts.py): ``before_stepping`` is what the worker
    stepping during backward calls first (the trainer's: wait until a background save's write has landed)."""
    if not (facts.steps_shards_on_host or facts.state_on_host):
        return StepAfterBackward(backend, optimizer, params, precision)
    times = OffloadTimes(model, StepClock())
    sib = None
    if facts.steps_shards_on_host:  # elsewhere --cpu-step is not about this run: nothing said
        sib = build_step_in_backward(cfg, backend, optimizer, params, precision, times.clock, before_stepping,
                                     after_because=facts.cpu_step_after_backward(backend.device.type))
    if sib is None:
        return TimedStepAfterBackward(backend, optimizer, params, precision, times)
    return StepDuringBackward(backend, optimizer, params, precision, times, sib)
