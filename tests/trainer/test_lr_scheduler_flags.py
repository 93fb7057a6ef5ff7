"""Every lr scheduler flag, given on shard-train's command line, changes the lr the run trains with.

The path is the CLI's: flags parsed by ``parse_train_args``, the scheduler built by the trainer's
``build_lr_scheduler`` on the trainer's optimizer. The expected lrs are worked out by hand from
fairseq 0.12's formulas (each written next to its numbers), never read from the schedulers.
"""
import math

import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.trainer.build import build_lr_scheduler, build_optimizer
from shardtrain.trainer.resolved import Components


def schedule(*flags):
    """The run's scheduler and optimizer for ``shard-train data-bin FLAGS``."""
    cfg = parse_train_args(["data-bin", *flags])
    components = Components.of(cfg)
    optimizer = build_optimizer(cfg, components, [torch.nn.Parameter(torch.zeros(3))], torch.device("cpu"))
    return build_lr_scheduler(cfg, components, optimizer), optimizer


def lrs_after(scheduler, optimizer, updates):
    """The lr on the optimizer after each of ``updates`` (what the next update trains with)."""
    out = []
    for n in updates:
        scheduler.step_update(n)
        out.append(optimizer.param_groups[0]["lr"])
    return out


@pytest.mark.flag_effect("--lr", "--warmup-updates", "--warmup-init-lr")
def test_inverse_sqrt_warmup_from_warmup_init_lr_then_decay():
    s, opt = schedule("--lr", "0.004", "--warmup-updates", "16", "--warmup-init-lr", "0.002")
    assert opt.param_groups[0]["lr"] == pytest.approx(0.002)  # update 1 runs at --warmup-init-lr
    # warmup: 0.002 + n * (0.004 - 0.002) / 16; after it: 0.004 * sqrt(16 / n)
    got = lrs_after(s, opt, [8, 16, 64, 100])
    assert got == pytest.approx([0.003, 0.004, 0.002, 0.0016], rel=1e-12)


@pytest.mark.flag_effect("--warmup-updates")
def test_inverse_sqrt_warmup_length_moves_the_peak():
    # --warmup-init-lr left at -1: warmup starts from 0; peak --lr 0.004 at update 16 instead of 4000
    s, opt = schedule("--lr", "0.004", "--warmup-updates", "16")
    assert opt.param_groups[0]["lr"] == 0.0
    assert lrs_after(s, opt, [4, 16, 400]) == pytest.approx([0.001, 0.004, 0.004 / 5], rel=1e-12)


@pytest.mark.flag_effect("--lr", "--warmup-updates", "--force-anneal", "--lr-shrink")
def test_fixed_warmup_and_annealing_from_force_anneal():
    s, opt = schedule("--lr-scheduler", "fixed", "--lr", "0.5", "--warmup-updates", "4", "--force-anneal", "2",
                      "--lr-shrink", "0.5")
    # warmup: after update n (< 4) the lr is 0.5 * (n + 1) / 4
    assert lrs_after(s, opt, [0, 1, 3, 10]) == pytest.approx([0.125, 0.25, 0.5, 0.5])
    # from epoch 2 (--force-anneal) on: 0.5 * 0.5 ** (epoch + 1 - 2)
    assert [s.step_begin_epoch(e) for e in (1, 2, 3)] == pytest.approx([0.5, 0.25, 0.125])


@pytest.mark.flag_effect("--lr")
def test_fixed_takes_one_lr_per_epoch():
    s, opt = schedule("--lr-scheduler", "fixed", "--lr", "0.3,0.2")
    assert opt.param_groups[0]["lr"] == pytest.approx(0.3)
    # one --lr per epoch, the last one for every later epoch
    assert [s.step_begin_epoch(e) for e in (1, 2, 3)] == pytest.approx([0.3, 0.2, 0.2])


@pytest.mark.flag_effect("--warmup-updates", "--total-num-update", "--end-learning-rate", "--power")
def test_polynomial_decay_warmup_decay_to_the_end_lr():
    s, opt = schedule("--lr-scheduler", "polynomial_decay", "--lr", "1.0", "--warmup-updates", "10",
                      "--total-num-update", "110", "--end-learning-rate", "0.1", "--power", "2")
    # n <= 10: n / 10; then (1 - 0.1) * (1 - (n - 10) / 100) ** 2 + 0.1; from 110: 0.1
    got = lrs_after(s, opt, [5, 10, 60, 90, 110, 500])
    assert got == pytest.approx([0.5, 1.0, 0.9 * 0.25 + 0.1, 0.9 * 0.04 + 0.1, 0.1, 0.1])


@pytest.mark.flag_effect("--max-update", "--force-anneal")
def test_polynomial_decay_over_max_update_and_force_anneal():
    s, opt = schedule("--lr-scheduler", "polynomial_decay", "--lr", "1.0", "--max-update", "200")
    assert lrs_after(s, opt, [50, 150]) == pytest.approx([0.75, 0.25])  # 1 - n / 200: decays over --max-update
    s, opt = schedule("--lr-scheduler", "polynomial_decay", "--lr", "1.0", "--total-num-update", "100",
                      "--force-anneal", "2")
    s.step_begin_epoch(1)
    assert s.step_update(50) == pytest.approx(0.5)
    assert s.step_begin_epoch(2) == pytest.approx(0.5)  # from epoch 2 the decay starts from the lr it holds
    assert s.step_update(60) == pytest.approx(0.5 * (1 - 60 / 100))


@pytest.mark.flag_effect("--warmup-updates", "--warmup-init-lr", "--min-lr", "--t-mult", "--lr-period-updates",
                         "--lr-shrink")
def test_cosine_warmup_then_growing_shrinking_periods():
    s, opt = schedule("--lr-scheduler", "cosine", "--lr", "1.0", "--min-lr", "0.1", "--warmup-updates", "10",
                      "--warmup-init-lr", "0.2", "--lr-period-updates", "20", "--t-mult", "2", "--lr-shrink", "0.5")
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    # after warmup (t = n - 10) periods are [0, 20), [20, 60), [60, 140); period i has max 1.0 * 0.5**i and
    # min 0.1 * 0.5**i; lr = min + (max - min) / 2 * (1 + cos(pi * t_in_period / period_length))
    got = lrs_after(s, opt, [5, 10, 20, 35, 50, 90])
    expected = [0.2 + 5 * 0.08, 1.0, 0.1 + 0.45, 0.05 + 0.225 * (1 + math.cos(math.pi * 5 / 40)), 0.05 + 0.225,
                0.025 + 0.1125 * (1 + math.cos(math.pi * 20 / 80))]
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.flag_effect("--max-lr")
def test_cosine_refuses_fairseq_0_10s_max_lr():
    with pytest.raises(ConfigError, match="--max-lr 2.0 is how fairseq<=0.10 set"):
        schedule("--lr-scheduler", "cosine", "--lr", "1.0", "--max-lr", "2.0", "--max-update", "100")


@pytest.mark.flag_effect("--warmup-updates", "--warmup-init-lr", "--lr-shrink", "--lr-threshold", "--lr-patience")
def test_reduce_lr_on_plateau_warmup_then_shrink_after_patience():
    s, opt = schedule("--lr-scheduler", "reduce_lr_on_plateau", "--lr", "1.0", "--warmup-updates", "4",
                      "--warmup-init-lr", "0.2", "--lr-shrink", "0.5", "--lr-patience", "1", "--lr-threshold", "0.1")
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    assert lrs_after(s, opt, [2, 4, 5]) == pytest.approx([0.6, 1.0, 1.0])  # 0.2 + n * 0.2, then flat
    # 9.5 is not 10% below 10, so epochs 2 and 3 are bad; the 2nd bad epoch (> patience 1) halves the lr;
    # 8 is 10% below the best (10), so the lr stays
    got = [s.step(epoch, loss) for epoch, loss in enumerate([10.0, 9.5, 9.5, 8.0, 7.9, 7.9], start=1)]
    assert got == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.5, 0.25])


@pytest.mark.flag_effect("--maximize-best-checkpoint-metric")
def test_reduce_lr_on_plateau_follows_a_metric_to_maximize():
    s, opt = schedule("--lr-scheduler", "reduce_lr_on_plateau", "--lr", "1.0",
                      "--maximize-best-checkpoint-metric")
    # patience 0, shrink 0.1: a metric that falls is a bad epoch when higher is better
    got = [s.step(epoch, v) for epoch, v in enumerate([1.0, 2.0, 1.5], start=1)]
    assert got == pytest.approx([1.0, 1.0, 0.1])


@pytest.mark.flag_effect("--warmup-steps", "--hold-steps", "--decay-steps", "--init-lr-scale", "--final-lr-scale")
def test_tri_stage_warmup_hold_decay():
    s, opt = schedule("--lr-scheduler", "tri_stage", "--lr", "2.0", "--warmup-steps", "10", "--hold-steps", "20",
                      "--decay-steps", "30", "--init-lr-scale", "0.5", "--final-lr-scale", "0.25")
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0)  # 2.0 * 0.5
    # warmup 1.0 -> 2.0 over 10; hold 2.0 until 30; decay 2.0 * 0.25 ** ((n - 30) / 30) until 60; then 0.5
    got = lrs_after(s, opt, [5, 10, 29, 45, 60, 61, 1000])
    assert got == pytest.approx([1.5, 2.0, 2.0, 1.0, 0.5, 0.5, 0.5])


@pytest.mark.flag_effect("--phase-ratio", "--max-update")
def test_tri_stage_phase_ratio_of_max_update():
    s, opt = schedule("--lr-scheduler", "tri_stage", "--lr", "2.0", "--phase-ratio", "(0.1, 0.2, 0.7)",
                      "--max-update", "100")
    # stages 10, 20, 70 updates; init and final scale 0.01 (defaults): 0.02 -> 2.0 -> 0.02
    got = lrs_after(s, opt, [5, 10, 29, 65, 100, 101])
    assert got == pytest.approx([0.02 + 5 * 0.198, 2.0, 2.0, 2.0 * 0.1, 0.02, 0.02])
