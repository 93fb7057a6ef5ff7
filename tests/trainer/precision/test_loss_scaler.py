"""fp16 dynamic loss scaling: the policy (fairseq's semantics) and the trainer's use of it."""
import math

import pytest
import torch

from shardtrain.data.collate import collate
from shardtrain.trainer.precision.loss_scaler import DynamicLossScaler, MinimumLossScaleError
from shardtrain.trainer.precision.component import Precision
from shardtrain.trainer.precision.diverged import TrainingDivergedError
from shardtrain.trainer.precision.fp16 import build_scaler
from small_trainer import blocks, data_bin, make_trainer, params  # noqa: F401 (data_bin is a fixture)


def test_scale_grows_after_a_window_of_clean_updates():
    s = DynamicLossScaler(init_scale=8, scale_window=3)
    scales = []
    for _ in range(7):
        s.update()
        scales.append(s.loss_scale)
    assert scales == [8, 8, 16, 16, 16, 32, 32]  # fairseq: (iter - last_overflow) % window == 0


def test_overflow_halves_and_restarts_the_window():
    s = DynamicLossScaler(init_scale=64, scale_window=2)
    s.update()
    s.overflow(update=2)
    assert s.loss_scale == 32
    s.update()
    assert s.loss_scale == 32  # one clean update since the overflow: not yet
    s.update()
    assert s.loss_scale == 64


def test_tolerance_and_threshold():
    s = DynamicLossScaler(init_scale=64, scale_window=100, tolerance=0.5)
    for _ in range(3):
        s.update()
    s.overflow(update=4)  # 1 overflow in 4 updates since the last rescale: 25% < 50%, keep the scale
    assert s.loss_scale == 64
    s.overflow(update=5)  # 2 in 5 updates
    assert s.loss_scale == 64
    s.overflow(update=6)  # 3 in 6: 50%, lower it
    assert s.loss_scale == 32
    t = DynamicLossScaler(init_scale=4, threshold=2.0)
    t.overflow(update=1)
    t.overflow(update=2)
    assert t.loss_scale == 2.0  # never below --threshold-loss-scale


def test_minimum_scale_stops_with_advice_or_keeps_skipping():
    s = DynamicLossScaler(init_scale=4, min_loss_scale=1.0)
    s.overflow(update=1)
    with pytest.raises(MinimumLossScaleError, match="update 2.*exploding.*--lr.*--fp16-no-stop-at-min-scale"):
        s.overflow(update=2)
    assert s.loss_scale == 2.0  # fairseq restores the last scale above the minimum
    keep = DynamicLossScaler(init_scale=4, min_loss_scale=1.0, stop_at_min_scale=False)
    for update in range(1, 6):
        keep.overflow(update=update)
    assert keep.loss_scale == 2.0


def test_state_round_trip():
    s = DynamicLossScaler(init_scale=16, scale_window=3)
    s.update()
    s.overflow(update=2)
    s.update()
    t = DynamicLossScaler(init_scale=1, scale_window=3)  # the policy comes from flags, the state from the checkpoint
    t.load_state_dict(s.state_dict())
    for _ in range(5):
        s.update()
        t.update()
        assert s.loss_scale == t.loss_scale


class _Cfg:
    def __init__(self, window=None, update_freq=1):
        self.common = type("C", (), dict(fp16_init_scale=128, fp16_scale_window=window, fp16_scale_tolerance=0.0,
                                         threshold_loss_scale=None, min_loss_scale=1e-4,
                                         fp16_no_stop_at_min_scale=False, fp16=True, amp=False))()
        self.optimization = type("O", (), dict(update_freq=update_freq))()


def test_default_window_follows_fairseq():
    assert build_scaler(_Cfg(), world_size=1).scale_window == 2 ** 14
    assert build_scaler(_Cfg(update_freq=4), world_size=8).scale_window == 2 ** 14 // 32
    assert build_scaler(_Cfg(window=7), world_size=8).scale_window == 7


def _poison_loss(trainer):
    """Make every forward's loss infinite (its gradient becomes inf/NaN)."""
    criterion = trainer.criterion

    class Poisoned:
        def __getattr__(self, name):
            return getattr(criterion, name)

        def __call__(self, model, sample):
            loss, size, log = criterion(model, sample)
            return loss * math.inf, size, log

    trainer.criterion = Poisoned()
    return criterion


@pytest.mark.flag_effect("--fp16", "--fp16-init-scale", "--fp16-scale-window")
def test_overflow_skips_the_update_and_leaves_the_weights(data_bin):
    trainer, task = make_trainer(data_bin, "--fp16", "--fp16-init-scale", "1024", "--fp16-scale-window", "2")
    batch = collate(blocks(task, range(4)), task.dictionary.pad())
    before = params(trainer)
    clean = _poison_loss(trainer)
    out = trainer.train_step([batch])
    assert not out["stepped"] and trainer.num_updates == 0 and out["loss_scale"] == 512
    assert all(torch.equal(a, b) for a, b in zip(before, params(trainer)))
    assert all(p.grad is None for p in trainer.model.parameters())
    trainer.criterion = clean
    out = trainer.train_step([batch])
    assert out["stepped"] and trainer.num_updates == 1 and math.isfinite(out["gnorm"])
    assert not all(torch.equal(a, b) for a, b in zip(before, params(trainer)))
    trainer.train_step([batch])
    assert trainer.precision.metrics()["loss_scale"] == 1024  # two clean updates (the window): doubled


def test_fp16_norm_and_clipping_are_of_the_unscaled_gradient(data_bin):
    """gnorm and the clipped update under --fp16 (loss scaled by 2**12) match fp32."""
    runs = {}
    for precision in ([], ["--fp16", "--fp16-init-scale", "4096"]):
        trainer, task = make_trainer(data_bin, "--clip-norm", "0.05", *precision)
        batch = collate(blocks(task, range(4)), task.dictionary.pad())
        out = trainer.train_step([batch])
        runs[bool(precision)] = (out, params(trainer))
    (out32, w32), (out16, w16) = runs[False], runs[True]
    assert out16["gnorm"] == pytest.approx(out32["gnorm"], rel=2e-2)
    assert out16["clip"] == out32["clip"] == 1.0
    for a, b in zip(w32, w16):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-3)


@pytest.mark.flag_effect("--min-loss-scale", "--fp16-no-stop-at-min-scale")
def test_minimum_scale_in_the_trainer(data_bin):
    trainer, task = make_trainer(data_bin, "--fp16", "--fp16-init-scale", "4", "--min-loss-scale", "1")
    batch = collate(blocks(task, range(4)), task.dictionary.pad())
    _poison_loss(trainer)
    trainer.train_step([batch])
    with pytest.raises(MinimumLossScaleError, match="Minimum loss scale reached"):
        trainer.train_step([batch])
    keep, task = make_trainer(data_bin, "--fp16", "--fp16-init-scale", "4", "--min-loss-scale", "1",
                              "--fp16-no-stop-at-min-scale")
    _poison_loss(keep)
    for _ in range(4):
        assert not keep.train_step([batch])["stepped"]
    assert keep.num_updates == 0


def test_loss_scale_is_checkpointed(data_bin):
    trainer, task = make_trainer(data_bin, "--fp16", "--fp16-init-scale", "64")
    batch = collate(blocks(task, range(4)), task.dictionary.pad())
    _poison_loss(trainer)
    trainer.train_step([batch])
    state = trainer.state_dict()
    fresh, _ = make_trainer(data_bin, "--fp16", "--fp16-init-scale", "64")
    fresh.load_state_dict(state)
    assert fresh.precision.metrics()["loss_scale"] == 32


@pytest.mark.flag_effect("--memory-efficient-fp16")
def test_memory_efficient_fp16_stores_fp16_and_tracks_fp32(data_bin):
    """Parameters and gradients in fp16, cpu_adam's state in fp32; training follows the fp32 run."""
    # lr 1e-2: steps well above fp16's spacing near these weights (2**-12 at 0.4), which rounds smaller ones
    adam = ["--optimizer", "cpu_adam", "--lr", "1e-2", "--fp16-init-scale", "1024"]
    runs = {}
    for precision in ([], ["--memory-efficient-fp16"]):
        trainer, task = make_trainer(data_bin, *adam, *precision)
        start = [p.float() for p in params(trainer)]
        batch = collate(blocks(task, range(4)), task.dictionary.pad())
        losses = [trainer.train_step([batch])["logs"][0]["loss"] for _ in range(5)]
        runs[bool(precision)] = (trainer, losses)
    (t32, l32), (t16, l16) = runs[False], runs[True]
    assert {p.dtype for p in t16.model.parameters()} == {torch.float16}
    states = [s for s in t16.optimizer.state.values() if "exp_avg" in s]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)
    assert t16.num_updates == 5 and l16 == pytest.approx(l32, rel=2e-2)
    # fp16 storage and fp16 compute end every step a little off, and Adam turns small-gradient noise into
    # lr-sized steps, so compare the whole displacement: the same direction, and a size within 10%.
    w0 = torch.cat([p.flatten() for p in start])
    d32 = torch.cat([p.flatten() for p in params(t32)]) - w0
    d16 = torch.cat([p.float().flatten() for p in params(t16)]) - w0
    assert float(torch.nn.functional.cosine_similarity(d16, d32, dim=0)) > 0.99
    assert float((d16 - d32).norm() / d32.norm()) < 0.1


def test_skip_nan_updates_counts_only_consecutive_ones():
    precision, nan, finite = Precision(skip_nan=2), torch.tensor(float("nan")), torch.tensor(1.0)
    assert [precision.accept(g, 5) for g in (nan, torch.tensor(float("inf")), finite, nan, nan)] == \
        [False, False, True, False, False]
    with pytest.raises(TrainingDivergedError, match="at update 7 after skipping 2 in a row"):
        precision.accept(nan, 7)
    with pytest.raises(TrainingDivergedError, match="pass over such updates with --skip-nan-updates N"):
        Precision().accept(nan, 1)
