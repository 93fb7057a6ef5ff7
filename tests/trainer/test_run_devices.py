"""The CUDA paths of a run, on the CPU, through stand-ins for torch.cuda (issue 28, item 4):

- --fixed-validation-seed: torch.manual_seed re-seeds every GPU's generator (torch.cuda.manual_seed_all),
  and fork_rng restores only the devices it is given; validation must give it the rank's own GPU, or
  training's GPU dropout restarts from the validation seed after every validation;
- a run without a process group (one GPU) sets its GPU as the current device before main, as a rank
  with a group does (else DeviceMesh warns and guesses a device, and the current device is not the rank's);
- models/init.py's fallback init seeds the CPU generator only (its draw is on the CPU).

FakeCudaGenerators stands in for the generator functions torch.random.manual_seed and fork_rng call,
with one real CPU torch.Generator per "GPU", so a dropout draw on it is a real random tensor.
"""
import types

import torch
from torch import nn

from shardtrain.models.init import init_
from shardtrain.trainer import loop, validation
from shardtrain.trainer.launch import start


class FakeCudaGenerators:
    """torch.cuda's get_rng_state/set_rng_state/manual_seed_all/device_count over ``count`` fake GPUs."""

    def __init__(self, monkeypatch, count: int):
        self.generators = [torch.Generator().manual_seed(1000 + i) for i in range(count)]
        self.read = []  # the devices whose state was read (each would open a CUDA context there)
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get_rng_state)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set_rng_state)
        monkeypatch.setattr(torch.cuda, "manual_seed_all", self.manual_seed_all)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)

    @staticmethod
    def _index(device) -> int:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        return device.index or 0

    def get_rng_state(self, device="cuda"):
        self.read.append(self._index(device))
        return self.generators[self._index(device)].get_state()

    def set_rng_state(self, state, device="cuda"):
        self.generators[self._index(device)].set_state(state)

    def manual_seed_all(self, seed):
        for g in self.generators:
            g.manual_seed(seed)

    def dropout_mask(self, index: int) -> torch.Tensor:
        """What a dropout call on GPU ``index`` draws."""
        return torch.rand(16, generator=self.generators[index]) < 0.5


def _run_on(device: torch.device, seed=123):
    return types.SimpleNamespace(cfg=types.SimpleNamespace(dataset=types.SimpleNamespace(fixed_validation_seed=seed)),
                                 backend=types.SimpleNamespace(device=device))


def _training_masks(monkeypatch, cuda: FakeCudaGenerators, device: torch.device, validate: bool):
    """Three updates' dropout masks on the rank's GPU, validating with a fixed seed after each (``validate``)."""
    monkeypatch.setattr(validation, "_validate_subsets", lambda run, epoch: [cuda.dropout_mask(device.index)])
    masks = []
    for _ in range(3):
        masks.append(cuda.dropout_mask(device.index))
        if validate:
            loop.validate(_run_on(device), epoch=1)
    return masks


def test_a_fixed_validation_seed_leaves_training_gpu_dropout_stream_alone(monkeypatch):
    """The masks of a run validating after every update are those of a run that never validates; with
    the bug the masks after each validation were all the same (drawn from the re-seeded generator)."""
    device = torch.device("cuda", 1)
    cuda = FakeCudaGenerators(monkeypatch, count=2)
    validated = _training_masks(monkeypatch, cuda, device, validate=True)
    assert cuda.read == [1, 1, 1]  # the rank's own GPU only: reading cuda:0 would open a context there
    plain = _training_masks(monkeypatch, FakeCudaGenerators(monkeypatch, count=2), device, validate=False)
    assert all(torch.equal(a, b) for a, b in zip(validated, plain))
    assert not torch.equal(validated[1], validated[2])


def test_validation_is_seeded_on_the_gpu_too(monkeypatch):
    """Inside validation the GPU's generator is the fixed seed's (validation is reproducible there)."""
    cuda = FakeCudaGenerators(monkeypatch, count=1)
    seen = []
    monkeypatch.setattr(validation, "_validate_subsets", lambda run, epoch: seen.append(cuda.dropout_mask(0)))
    loop.validate(_run_on(torch.device("cuda", 0), seed=5), epoch=1)
    assert torch.equal(seen[0], torch.rand(16, generator=torch.Generator().manual_seed(5)) < 0.5)


def test_a_cpu_run_reads_no_gpu_generator_when_validating(monkeypatch):
    """--cpu on a GPU machine: validation forks the CPU generator only (reading a GPU's opens a context),
    and still restores it."""
    cuda = FakeCudaGenerators(monkeypatch, count=2)
    monkeypatch.setattr(validation, "_validate_subsets", lambda run, epoch: [torch.rand(3)])
    before = torch.get_rng_state()
    loop.validate(_run_on(torch.device("cpu")), epoch=1)
    assert cuda.read == [] and torch.equal(torch.get_rng_state(), before)


def test_the_fallback_init_reseeds_no_gpu_generator(monkeypatch):
    """An init function init_ does not know (orthogonal_) is drawn in full from a seeded CPU generator;
    seeding it must not re-seed the GPUs' generators, which fork_rng(devices=[]) would not restore."""
    cuda = FakeCudaGenerators(monkeypatch, count=2)
    torch.manual_seed(0)
    before = [g.get_state() for g in cuda.generators]
    weight = torch.empty(4, 4)
    init_(weight, nn.init.orthogonal_)
    assert all(torch.equal(g.get_state(), state) for g, state in zip(cuda.generators, before))
    assert torch.allclose(weight @ weight.T, torch.eye(4), atol=1e-5)  # it did initialise


def _launch(monkeypatch, gpus: int, env=None):
    """call_main on a machine with ``gpus`` fake GPUs; returns the calls to set_device and main, in order."""
    calls = []
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", torch.device(device))))
    monkeypatch.setattr(start, "setup_logging", lambda *args: None)
    monkeypatch.setattr(start.threads, "apply_threads", lambda *args, **kwargs: None)
    cfg = types.SimpleNamespace(
        common=types.SimpleNamespace(cpu=gpus == 0, log_file=None, threads=1),
        distributed=types.SimpleNamespace(distributed_world_size=1, distributed_init_method=None,
                                          distributed_backend=None, heartbeat_timeout=60))

    def main(cfg, ctx):
        calls.append(("main", ctx.device, ctx.backend))
        return "done"

    assert start.call_main(cfg, main) == "done"
    return calls


def test_a_one_gpu_run_without_a_process_group_sets_its_device_before_main(monkeypatch):
    cuda0 = torch.device("cuda", 0)
    assert _launch(monkeypatch, gpus=1) == [("set_device", cuda0), ("main", cuda0, None)]


def test_a_one_rank_launch_on_another_gpu_makes_that_gpu_current(monkeypatch):
    """torchrun-style variables for one rank whose LOCAL_RANK is 1: its device is cuda:1, and that must be
    the current device (before the fix it stayed cuda:0, where its RNG state was read and "cuda" tensors went)."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}
    cuda1 = torch.device("cuda", 1)
    assert _launch(monkeypatch, gpus=2, env=env) == [("set_device", cuda1), ("main", cuda1, None)]


def test_a_cpu_run_sets_no_gpu(monkeypatch):
    assert _launch(monkeypatch, gpus=0) == [("main", torch.device("cpu"), None)]

