"""The Trainer: one training step, one validation step, and its own state.

It holds the model, criterion, optimizer, lr scheduler, a data-parallel
backend and a precision component, and never branches on which backend or
precision it has.
"""
import contextlib
from typing import Dict, List

import torch

from shardtrain.trainer import build
from shardtrain.trainer.checkpoint.async_staging import wait_for_live_writes
from shardtrain.trainer.checkpoint.contents import load_parts, state_of, trainer_parts
from shardtrain.trainer.optimizer_step import choose_optimizer_step
from shardtrain.trainer.parallel.choose import Backend
from shardtrain.trainer.precision.component import Precision  # noqa: F401 (re-exported)
from shardtrain.trainer.precision.diverged import TrainingDivergedError  # noqa: F401 (re-exported)
from shardtrain.trainer.resolved import Components
from shardtrain.trainer.run_facts import RunFacts
from shardtrain.trainer.train_state import TrainState


class Trainer:
    def __init__(self, cfg, components: Components, task, model, criterion, backend: Backend, precision: Precision,
                 facts: RunFacts):
        """``model``: as ``prepare_model`` returns it (initialised, cast and wrapped by ``backend``);
        ``components``: the run's resolved classes, for the optimizer and lr scheduler; ``facts``: the run's
        (run_facts.py), which it reads rather than work out again."""
        self.cfg = cfg
        self.task = task
        self.criterion = criterion
        self.backend = backend
        self.precision = precision
        self.device = backend.device
        self.model = model
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = build.build_optimizer(cfg, components, self.params, backend.optimizer_device)
        self.dummy_batch = None  # stands in for an empty filler batch (see set_dummy_batch)
        self.lr_scheduler = build.build_lr_scheduler(cfg, components, self.optimizer)
        self.state = TrainState()
        # After backward, timed where the optimizer steps in host memory, or each shard during backward: chosen
        # once, from the facts (trainer/optimizer_step.py)
        self.optimizer_step = choose_optimizer_step(cfg, facts, backend, model, self.optimizer, self.params,
                                                    precision, before_stepping=wait_for_live_writes)

    @property
    def step_in_backward(self):
        """The optimizer stepping each shard during backward (parallel/step_in_backward.py), or None."""
        return self.optimizer_step.step_in_backward

    @property
    def times(self):
        """Where each update's time goes (offload_times.py), where the optimizer steps in host memory; or None."""
        return self.optimizer_step.times

    def close(self) -> None:
        """Remove the hooks the trainer put on the model and its parameters (the step during backward's, the
        upload timer's): the model may outlive the run (tests, shard-plan --verify's several runs a process)."""
        self.optimizer_step.close()

    @property
    def num_updates(self) -> int:
        return self.state.num_updates

    def set_dummy_batch(self, batch: Dict) -> None:
        """A real batch to run, with zero weight, when this rank's share of an
        update is an empty filler: collectives in forward/backward (DDP, FSDP)
        must run on every rank the same number of times."""
        self.dummy_batch = self._to_device(batch)

    def get_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    # -- steps -----------------------------------------------------------------
    def train_step(self, samples: List[Dict]) -> Dict:
        """Forward/backward over ``samples`` (the --update-freq batches), then one update."""
        self.model.train()
        samples = [self._to_device(s) for s in samples]
        sizes = torch.tensor([float(self.criterion_sample_size(s)) for s in samples if s] or [0.0]).sum()
        sample_size = float(self.backend.all_reduce_sum(sizes.to(self.device)))
        logs = []
        with self.optimizer_step.backward():
            for i, sample in enumerate(samples):
                last = i == len(samples) - 1
                if last:
                    self.optimizer_step.last_backward(self._multiplier(sample_size))
                with contextlib.nullcontext() if last else self.backend.no_sync(self.model):
                    with self.precision.autocast():
                        loss, _, log = self.criterion(self.model, sample or self.dummy_batch)
                    # Backward of the *summed* loss, as fairseq: dividing by the sample size first
                    # would push fp16 gradients below fp16's range (a 50k vocabulary's logit
                    # gradients flush to zero); _update divides once the gradients are fp32 or reduced.
                    self.precision.backward(loss if sample else loss * 0.0)
                logs.append(log if sample else {k: 0 * v for k, v in log.items()})
            self.backend.reduce_grads(self.params)
        return self._update(logs, sample_size)

    def _multiplier(self, sample_size: float) -> float:
        """The gradients are loss_scale x the summed loss's gradient (averaged over ranks by DDP/FSDP):
        this makes them the gradient of the update's mean loss (clipping aside). Known before backward."""
        ranks = self.backend.world_size if self.backend.grads_are_averaged else 1.0
        return self.precision.unscale_factor() * ranks / max(sample_size, 1.0)

    def _update(self, logs: List[Dict], sample_size: float) -> Dict:
        with self.optimizer_step.stepping():
            gnorm, clipped, stepped = self._step(sample_size)
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.lr_scheduler.step_update(self.num_updates)
        out = {"logs": self._reduce_logs(logs), "sample_size": sample_size, "gnorm": float(gnorm),
               "clip": float(clipped), "lr": lr, "stepped": stepped, **self.precision.metrics(),
               **self.optimizer_step.fields()}
        return out

    def _step(self, sample_size: float):
        """The gradient norm, the decision (step, clipped, or skip) and the step: (gnorm, clipped, stepped)."""
        multiplier = self._multiplier(sample_size)
        gnorm = self.optimizer_step.grad_norm() * multiplier
        clip = self.cfg.optimization.clip_norm
        clipped = False
        try:
            stepped = self.precision.accept(gnorm, self.num_updates + 1)  # False: skipped (fp16 overflow, NaN)
        except BaseException:  # the run stops (NaN/inf)
            self.optimizer_step.stop()
            raise
        if stepped:
            clipped = clip > 0 and float(gnorm) > clip
            if clipped:  # torch's and fairseq's clip coefficient
                multiplier *= clip / (float(gnorm) + 1e-6)
            self.optimizer_step.step(multiplier, clipped)
            self.state.num_updates += 1
        else:
            self.optimizer_step.skip()
        return gnorm, clipped, stepped

    @torch.no_grad()
    def valid_step(self, sample: Dict) -> List[Dict]:
        self.model.eval()
        sample = self._to_device(sample)
        with self.precision.autocast():
            _, _, log = self.criterion(self.model, sample or self.dummy_batch)
        return self._reduce_logs([log if sample else {k: 0 * v for k, v in log.items()}])

    def criterion_sample_size(self, sample: Dict) -> int:
        return sample["target"].size(0) if self.criterion.sentence_avg else sample["ntokens"]

    def _reduce_logs(self, logs: List[Dict]) -> List[Dict]:
        """Sum logging outputs over batches and ranks (one all-reduce)."""
        keys = sorted({k for log in logs for k in log})
        if not keys:
            return []
        values = torch.tensor([[float(log.get(k, 0)) for k in keys] for log in logs] or [[0.0] * len(keys)],
                              dtype=torch.float64).sum(0)
        values = self.backend.all_reduce_sum(values.to(self.device)).cpu().tolist()
        return [dict(zip(keys, values))]

    def _to_device(self, sample: Dict) -> Dict:
        return _move(sample, self.device) if sample else sample

    # -- state -----------------------------------------------------------------
    def lr_step_begin_epoch(self, epoch: int) -> float:
        return self.lr_scheduler.step_begin_epoch(epoch)

    def lr_step(self, epoch: int, val_loss=None) -> float:
        self.lr_scheduler.step(epoch, val_loss)
        return self.lr_scheduler.step_update(self.num_updates)

    def state_dict(self) -> Dict:
        """The trainer's parts of a checkpoint (see checkpoint/contents.py, which adds the run's)."""
        return state_of(trainer_parts(self))

    def load_state_dict(self, state: Dict) -> None:
        load_parts(trainer_parts(self), state)
        self.resumed()

    def resumed(self) -> None:
        """After loading: the lr of the loaded update (also when the scheduler itself was reset)."""
        self.lr_scheduler.step_update(self.num_updates)


def _move(obj, device):
    if torch.is_tensor(obj):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(v, device) for v in obj)
    return obj

