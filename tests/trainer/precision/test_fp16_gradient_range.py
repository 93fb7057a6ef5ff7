"""fp16 gradients keep the range they have in fairseq: backward of the summed loss
times the loss scale, with 1/sample_size applied afterwards.

Dividing the loss by the sample size before backward (as shardtrain once did)
makes a 32k+ vocabulary's logit gradients p/sample_size * scale: a third of them
flush to zero and most of the rest are subnormal in fp16.
"""

import numpy as np
import pytest
import torch

from fp16_range_helpers import (
    LogitGradients, big_vocab_data_bin, config, first_batch, open_run, zero_and_subnormal_fractions,
)

UPDATES = 20


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return big_vocab_data_bin(str(tmp_path_factory.mktemp("vocab32k")))


PRECISIONS = [["--fp16"], ["--memory-efficient-fp16", "--optimizer", "cpu_adam"]]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_logit_gradients_no_worse_than_fairseqs_scheme(data_bin, tmp_path, precision):
    check_logit_gradients(data_bin, str(tmp_path), precision)


def check_logit_gradients(data_bin, save_dir, precision, cpu=True):
    run = open_run(config(data_bin, save_dir, *precision, cpu=cpu))
    try:
        trainer = run.trainer
        assert len(trainer.task.source_dictionary) >= 32768
        sample = first_batch(run)
        recorder = LogitGradients(trainer.model)
        # fairseq's scheme on the same weights: backward of the summed loss times the loss scale
        with trainer.precision.autocast():
            loss, _, _ = trainer.criterion(trainer.model, sample)
        (loss * trainer.precision.scaler.loss_scale).backward()
        trainer.model.zero_grad(set_to_none=True)
        out = trainer.train_step([sample])
    finally:
        run.close()
    assert out["stepped"] and len(recorder.grads) == 2
    fairseq, ours = recorder.grads
    assert ours.dtype == torch.float16 and ours.shape[-1] >= 32768
    zero_f, subnormal_f = zero_and_subnormal_fractions(fairseq)
    zero_o, subnormal_o = zero_and_subnormal_fractions(ours)
    assert zero_o <= zero_f and subnormal_o <= subnormal_f, (zero_o, zero_f, subnormal_o, subnormal_f)


# On the CPU fp16 matrix products are emulated (about 60x float32's time) and the 32k-word output layer is
# most of each update: 4 x 32 tokens an update there halves the time (4 x 64 on a GPU, as the logit test).
# Measured on the CPU with 4 x 32: SGD's error ratio 8% (bound 15%), Adam's 18% (bound 25%), loss off by 5e-4
# at most, and fp32's loss falls by 2.2 (SGD) and 0.77 (Adam) in the 20 updates.
CPU_TOKENS = ["--tokens-per-sample", "32"]


def _train(data_bin, save_dir, *flags, cpu=True):
    """(per-update losses, initial weights, final weights) of one in-process run."""
    run = open_run(config(data_bin, save_dir, "--max-update", str(UPDATES), "--clip-norm", "0",
                          *(CPU_TOKENS if cpu else []), *flags, cpu=cpu))
    losses, step = [], run.trainer.train_step

    def recording_step(samples):
        out = step(samples)
        assert out["clip"] == 0.0 and out["stepped"]  # no clipping, no skipped update hides a wrong scale
        losses.append(out["logs"][0]["loss"] / out["sample_size"])
        return out

    try:
        initial = {k: v.float().cpu().clone() for k, v in run.trainer.model.state_dict().items()}
        run.trainer.train_step = recording_step
        from shardtrain.trainer.loop import train

        train(run)
        final = {k: v.float().cpu().clone() for k, v in run.trainer.model.state_dict().items()}
    finally:
        run.close()
    return np.array(losses), initial, final


# (flags, fp16 flag, per-tensor bound on |displacement error| / |displacement|). SGD's update is
# lr x gradient, so a wrong gradient scale moves the weights by as much more; 20 updates of fp16
# autocast round-off stay below 10% (measured). Adam's update is about lr whatever the gradient's
# size, so it gets a bound per element too (below).
CASES = [
    (["--optimizer", "sgd", "--lr", "0.5"], "--fp16", 0.15),
    (["--optimizer", "cpu_adam", "--lr", "1e-3"], "--memory-efficient-fp16", 0.25),
]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, fp16, bound", CASES)
def test_fp16_follows_fp32_within_the_update_size(data_bin, tmp_path, optimizer, fp16, bound):
    check_fp16_follows_fp32(data_bin, tmp_path, optimizer, fp16, bound)


def check_fp16_follows_fp32(data_bin, tmp_path, optimizer, fp16, bound, cpu=True):
    losses32, w0, w32 = _train(data_bin, str(tmp_path / "fp32"), *optimizer, cpu=cpu)
    losses16, w0_16, w16 = _train(data_bin, str(tmp_path / "fp16"), *optimizer, fp16, cpu=cpu)
    assert len(losses16) == len(losses32) == UPDATES
    assert losses32[-1] < losses32[0] - 0.5  # it learns: the displacements are real
    np.testing.assert_allclose(losses16, losses32, rtol=1e-3)
    lr = float(optimizer[-1])
    for name in w32:
        moved = w32[name] - w0[name]
        if moved.abs().max() == 0:
            continue
        assert torch.allclose(w0_16[name], w0[name], atol=1e-3), name  # same start (fp16-rounded at most)
        error = ((w16[name] - w0_16[name]) - moved).abs()
        if "adam" in optimizer[1] and name.endswith("qkv_proj.bias"):
            # The key bias (the middle third) has a true gradient of 0 (softmax ignores a constant
            # per query): Adam turns its round-off, which fp16 and fp32 draw differently, into
            # lr-sized steps. The query and value biases are checked like everything else.
            third = moved.numel() // 3
            keep = torch.cat([torch.arange(third), torch.arange(2 * third, moved.numel())])
            moved, error = moved[keep], error[keep]
        if "adam" in optimizer[1]:
            # An Adam step is about lr per element: no element may be off by half of 20 steps.
            # A gradient that flushed to zero in fp16 would leave its element 20 x lr behind.
            assert (error > 0.5 * lr * UPDATES).double().mean() <= 0.03, name
        assert error.norm() <= bound * moved.norm(), (name, float(error.norm() / moved.norm()))


@pytest.mark.parametrize("optimizer", ["cpu_adam", "adafactor"])
def test_memory_efficient_fp16_unscales_inside_the_optimizer(optimizer):
    """fp16 gradients hold loss_scale x sample_size x the true gradient; unscaled in fp16 (as
    fairseq does) true gradients below 6e-8 would flush to zero and an adaptive optimizer
    would not move them at all. The optimizer applies the multiplier in fp32 instead."""
    from shardtrain.optim.adafactor import Adafactor
    from shardtrain.optim.cpu_adam import CPUAdam
    from shardtrain.trainer.parallel.base import Backend
    from shardtrain.trainer.precision.loss_scaler import DynamicLossScaler
    from shardtrain.trainer.precision.memory_efficient_fp16 import MemoryEfficientFP16Precision

    generator = torch.Generator().manual_seed(0)
    signs = torch.randint(0, 2, (64, 64), generator=generator) * 2 - 1
    true = signs * torch.logspace(-10, -3, 64 * 64).view(64, 64)  # most below fp16's smallest normal
    multiplier = 1.0 / (128 * 4096)
    make = {"cpu_adam": lambda ps: CPUAdam(ps, lr=1e-3),
            "adafactor": lambda ps: Adafactor(ps, lr=1e-3, scale_parameter=False, relative_step=False)}[optimizer]
    init = torch.randn(64, 64, generator=generator).half()
    p16 = torch.nn.Parameter(init.clone())
    p16.grad = (true / multiplier).half()  # the scaled fp16 gradient backward leaves
    backend = type("B", (), {"multiply_grads": lambda self, params, m: Backend.multiply_grads(self, params, m)})()
    MemoryEfficientFP16Precision(DynamicLossScaler()).step(make([p16]), backend, [p16], multiplier)
    ref = torch.nn.Parameter(init.float())
    ref.grad = p16.grad.float() * multiplier  # the same gradient, unscaled in fp32
    make([ref]).step()
    moved, expected = (p16.detach().float() - init.float()), (ref.detach() - init.float())
    assert (expected != 0).all()
    # fp16 parameters: the update lands rounded to the parameter's precision
    assert torch.allclose(moved, expected, atol=2 * torch.finfo(torch.float16).eps * init.float().abs().max())


def test_memory_efficient_fp16_steps_an_optimizer_without_a_grad_multiplier():
    """A plugin optimizer registered with supports_memory_efficient_fp16=True (docs/plugins.md) need not apply
    the multiplier itself: its fp16 gradients are unscaled in place first, as fairseq's are (red team 4.6)."""
    from shardtrain.trainer.parallel.base import Backend
    from shardtrain.trainer.precision.loss_scaler import DynamicLossScaler
    from shardtrain.trainer.precision.memory_efficient_fp16 import MemoryEfficientFP16Precision

    p16 = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float16))
    p16.grad = torch.tensor([512.0, 1024.0], dtype=torch.float16)  # scaled: the true gradient is [0.5, 1.0]
    backend = type("B", (), {"multiply_grads": lambda self, params, m: Backend.multiply_grads(self, params, m)})()
    MemoryEfficientFP16Precision(DynamicLossScaler()).step(torch.optim.SGD([p16], lr=0.25), backend, [p16],
                                                            1.0 / 1024)
    assert p16.detach().tolist() == [0.875, -2.25]  # 1 - 0.25 * 0.5, -2 - 0.25 * 1.0
