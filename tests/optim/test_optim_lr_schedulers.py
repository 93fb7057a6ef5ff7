"""LR schedules against fairseq 0.12's formulas, written out by hand here."""
import argparse
import dataclasses
import io
import math

import pytest
import torch
from omegaconf import OmegaConf

from shardtrain.config import flags
from shardtrain.config.sections import SECTIONS
from shardtrain.core.errors import ConfigError
from shardtrain.optim import LR_SCHEDULER_REGISTRY, OPTIMIZER_REGISTRY
from shardtrain.optim.lr_scheduler import LRScheduler


def make_optimizer():
    # Two param groups: the schedule must set the lr on both.
    w, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    return torch.optim.SGD([{"params": [w]}, {"params": [b], "weight_decay": 0.0}], lr=123.0)


def make(name, lr=1.0, max_update=0, **values):
    entry = LR_SCHEDULER_REGISTRY.get(name)
    optimizer = make_optimizer()
    return entry.obj(entry.config_cls(**values), optimizer, lr, max_update), optimizer


def lrs_after(scheduler, updates):
    """lr after each of ``updates`` (each checked on every param group)."""
    out = []
    for n in updates:
        lr = scheduler.step_update(n)
        assert [g["lr"] for g in scheduler.optimizer.param_groups] == [lr, lr]
        out.append(lr)
    return out


# ---------------------------------------------------------------- fixed

def test_fixed_warmup_then_constant():
    s, opt = make("fixed", lr=0.5, warmup_updates=4)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * 1 / 4)  # lr for update 0, set on construction
    assert lrs_after(s, [0, 1, 3, 4, 10]) == pytest.approx([0.125, 0.25, 0.5, 0.5, 0.5])


def test_fixed_force_anneal_shrinks_from_that_epoch():
    s, opt = make("fixed", lr=0.5, force_anneal=3, lr_shrink=0.1)
    expected = {1: 0.5, 2: 0.5, 3: 0.5 * 0.1, 4: 0.5 * 0.01, 5: 0.5 * 0.001}
    for epoch, lr in expected.items():
        assert s.step_begin_epoch(epoch) == pytest.approx(lr)
        assert s.step_update(100 * epoch) == pytest.approx(lr)
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([lr, lr])


def test_fixed_rejects_bad_values():
    with pytest.raises(ConfigError, match="--warmup-updates"):
        make("fixed", warmup_updates=-1)
    with pytest.raises(ConfigError, match="--force-anneal"):
        make("fixed", force_anneal=0)


# ---------------------------------------------------------------- inverse_sqrt

def test_inverse_sqrt_warmup_from_zero_then_decay():
    s, opt = make("inverse_sqrt", lr=1e-3, warmup_updates=100)
    assert opt.param_groups[1]["lr"] == 0.0
    got = lrs_after(s, [0, 50, 99, 100, 400, 10000])
    expected = [0.0, 0.5e-3, 0.99e-3, 1e-3, 1e-3 * math.sqrt(100 / 400), 1e-3 * 0.1]
    assert got == pytest.approx(expected, rel=1e-12)


def test_inverse_sqrt_warmup_init_lr():
    s, _ = make("inverse_sqrt", lr=2e-3, warmup_updates=10, warmup_init_lr=1e-3)
    assert lrs_after(s, [0, 5, 10, 40]) == pytest.approx([1e-3, 1.5e-3, 2e-3, 1e-3])


def test_inverse_sqrt_defaults_and_zero_warmup():
    cfg = LR_SCHEDULER_REGISTRY.get("inverse_sqrt").config_cls()
    assert (cfg.warmup_updates, cfg.warmup_init_lr) == (4000, -1)
    with pytest.raises(ConfigError, match="--warmup-updates > 0"):
        make("inverse_sqrt", warmup_updates=0)


# ---------------------------------------------------------------- polynomial_decay

def test_polynomial_decay_warmup_decay_end():
    s, opt = make("polynomial_decay", lr=1.0, warmup_updates=10, total_num_update=110,
                  end_learning_rate=0.1, power=2.0)
    assert opt.param_groups[0]["lr"] == 0.0  # fairseq's first warmup update runs at lr 0
    got = lrs_after(s, [0, 5, 10, 60, 109, 110, 500])
    decay = [0.9 * (1 - 50 / 100) ** 2 + 0.1, 0.9 * (1 - 99 / 100) ** 2 + 0.1]
    assert got == pytest.approx([0.0, 0.5, 1.0, decay[0], decay[1], 0.1, 0.1])


def test_polynomial_decay_total_defaults_to_max_update():
    s, _ = make("polynomial_decay", lr=2.0, max_update=200)
    assert lrs_after(s, [0, 50, 200]) == pytest.approx([2.0, 1.5, 0.0])
    with pytest.raises(ConfigError, match="--total-num-update nor --max-update"):
        make("polynomial_decay", max_update=0)
    with pytest.raises(ConfigError, match="--warmup-updates 300 is longer"):
        make("polynomial_decay", max_update=200, warmup_updates=300)


def test_polynomial_decay_force_anneal_restarts_decay_from_current_lr():
    s, _ = make("polynomial_decay", lr=1.0, total_num_update=100, force_anneal=2)
    s.step_begin_epoch(1)
    assert s.step_update(50) == pytest.approx(0.5)
    assert s.step_begin_epoch(2) == pytest.approx(0.5)  # the base lr is now 0.5
    assert s.step_update(60) == pytest.approx(0.5 * (1 - 60 / 100))


# ---------------------------------------------------------------- cosine

def test_cosine_warmup_one_period_then_restart():
    # --lr is the max; warmup starts at --min-lr; the period defaults to max_update - warmup.
    s, opt = make("cosine", lr=1.0, min_lr=0.1, warmup_updates=10, max_update=110)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    got = lrs_after(s, [0, 5, 10, 35, 60, 110, 160])
    expected = [0.1, 0.1 + 5 * 0.09, 1.0,
                0.1 + 0.45 * (1 + math.cos(math.pi / 4)), 0.55,
                0.1,  # second period: max and min shrink by lr_shrink 0.1
                0.01 + 0.045 * (1 + math.cos(math.pi / 2))]
    assert got == pytest.approx(expected)


def test_cosine_t_mult_grows_periods():
    s, _ = make("cosine", lr=1.0, lr_period_updates=10, t_mult=2.0)
    # periods: [0, 10), [10, 30), [30, 70); each restart shrinks the peak by 0.1
    assert lrs_after(s, [0, 5, 10, 20, 30, 50]) == pytest.approx([1.0, 0.5, 0.1, 0.05, 0.01, 0.005])


def test_cosine_invalid_flags():
    with pytest.raises(ConfigError, match="--max-lr .* pass its value as --lr"):
        make("cosine", max_lr=1.0, max_update=100)
    with pytest.raises(ConfigError, match="must be more than --min-lr"):
        make("cosine", lr=0.1, min_lr=0.1, max_update=100)
    with pytest.raises(ConfigError, match="--lr-period-updates"):
        make("cosine", max_update=0)
    with pytest.raises(ConfigError, match="--lr-period-updates"):
        make("cosine", max_update=100, warmup_updates=100)


# ---------------------------------------------------------------- tri_stage

def test_tri_stage_all_stages():
    s, opt = make("tri_stage", lr=1.0, warmup_steps=10, hold_steps=20, decay_steps=30)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    got = lrs_after(s, [0, 5, 10, 29, 30, 45, 60, 61, 1000])
    expected = [0.01, 0.01 + 5 * 0.099, 1.0, 1.0, 1.0, 0.1, 0.01, 0.01, 0.01]  # 0.01 ** (15 / 30) = 0.1
    assert got == pytest.approx(expected)


def test_tri_stage_phase_ratio_uses_max_update():
    s, _ = make("tri_stage", lr=2.0, phase_ratio=(0.1, 0.2, 0.7), max_update=100, init_lr_scale=0.5,
                final_lr_scale=0.25)
    assert (s.warmup_steps, s.hold_steps, s.decay_steps) == (10, 20, 70)
    assert lrs_after(s, [0, 5, 10, 30, 65, 100, 101]) == pytest.approx([1.0, 1.5, 2.0, 2.0, 1.0, 0.5, 0.5])
    s2, _ = make("tri_stage", phase_ratio="(0.1, 0.2, 0.7)", max_update=100)
    assert s2.decay_steps == 70


def test_tri_stage_invalid_flags():
    with pytest.raises(ConfigError, match="add up to 1"):
        make("tri_stage", phase_ratio=(0.1, 0.2, 0.6), max_update=100)
    with pytest.raises(ConfigError, match="--phase-ratio must be 3 numbers"):
        make("tri_stage", phase_ratio=(0.5, 0.5), max_update=100)
    with pytest.raises(ConfigError, match="--max-update"):
        make("tri_stage", phase_ratio=(0.1, 0.4, 0.5), max_update=0)
    with pytest.raises(ConfigError, match="has no steps"):
        make("tri_stage")


# ---------------------------------------------------------------- every scheduler

SCHEDULES = {
    "fixed": dict(lr=0.5, warmup_updates=6, force_anneal=2, lr_shrink=0.5),
    "inverse_sqrt": dict(lr=1e-3, warmup_updates=8),
    "polynomial_decay": dict(lr=1.0, warmup_updates=6, max_update=60, force_anneal=2, power=1.5),
    "cosine": dict(lr=1.0, min_lr=0.01, warmup_updates=5, lr_period_updates=12, t_mult=1.5, max_update=60),
    "tri_stage": dict(lr=1.0, warmup_steps=5, hold_steps=10, decay_steps=20),
}


def drive(scheduler, epochs, start_epoch=1, start_update=0, updates_per_epoch=7):
    """Run the trainer's calling sequence; returns every lr it produced."""
    lrs, n = [], start_update
    for epoch in range(start_epoch, start_epoch + epochs):
        lrs.append(scheduler.step_begin_epoch(epoch))
        for _ in range(updates_per_epoch):
            n += 1
            lrs.append(scheduler.step_update(n))
        lrs.append(scheduler.step(epoch, val_loss=10.0 / epoch))
    return lrs, n


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_state_dict_round_trip_continues_identically(name):
    original, opt = make(name, **SCHEDULES[name])
    _, n = drive(original, epochs=3)
    state = original.state_dict()
    buffer = io.BytesIO()
    torch.save(state, buffer)  # checkpoints load with weights_only=True: plain data only
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    resumed, resumed_opt = make(name, **SCHEDULES[name])
    resumed.load_state_dict(state)
    assert resumed_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert resumed.best == original.best == pytest.approx(10.0 / 3)
    expected, _ = drive(original, epochs=3, start_epoch=4, start_update=n)
    got, _ = drive(resumed, epochs=3, start_epoch=4, start_update=n)
    assert got == expected


@pytest.mark.parametrize("name", ["fixed", "polynomial_decay"])
def test_resume_without_state_would_differ(name):
    # The round trip above is meaningful: these schedules carry state beyond num_updates.
    original, _ = make(name, **SCHEDULES[name])
    _, n = drive(original, epochs=3)
    fresh, _ = make(name, **SCHEDULES[name])
    expected, _ = drive(original, epochs=2, start_epoch=4, start_update=n)
    got, _ = drive(fresh, epochs=2, start_epoch=4, start_update=n)
    assert got != pytest.approx(expected)


def test_best_tracks_the_lowest_validation_loss_and_loads_fairseq_state():
    s, _ = make("inverse_sqrt", warmup_updates=10)
    assert s.best is None
    for loss in (3.0, 2.0, 2.5):
        s.step(1, val_loss=loss)
    assert s.best == 2.0
    s.step(2)
    assert s.best == 2.0
    lr_before = s.get_lr()
    s.load_state_dict({"best": 7.701})  # what a fairseq 0.12 checkpoint holds
    assert s.best == 7.701 and s.get_lr() == lr_before


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_registered_with_documented_config(name):
    entry = LR_SCHEDULER_REGISTRY.get(name)
    assert issubclass(entry.obj, LRScheduler)
    assert all(f.metadata.get("help") for f in dataclasses.fields(entry.config_cls))


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_built_from_generated_flags(name):
    # The CLI's path: flags generated from the dataclass, merged into an OmegaConf node.
    entry = LR_SCHEDULER_REGISTRY.get(name)
    parser = argparse.ArgumentParser()
    flags.add_dataclass_flags(parser, "lr_scheduler", entry.config_cls)
    argv = {"fixed": ["--force-anneal", "2"], "inverse_sqrt": ["--warmup-updates", "10"],
            "polynomial_decay": ["--total-num-update", "50"], "cosine": ["--lr-period-updates", "20"],
            "tri_stage": ["--phase-ratio", "(0.1, 0.4, 0.5)"]}[name]
    values = flags.section_values(parser.parse_args(argv), "lr_scheduler")
    cfg = OmegaConf.merge(OmegaConf.structured(entry.config_cls), values)
    scheduler = entry.obj(cfg, make_optimizer(), 1.0, 100)
    assert scheduler.step_update(100) == pytest.approx(
        {"fixed": 1.0, "inverse_sqrt": 1.0 * math.sqrt(10 / 100), "polynomial_decay": 0.0,
         "cosine": 1.0 * 0.1 ** 5, "tri_stage": 0.01}[name])


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZER_REGISTRY.names()))
def test_flags_do_not_clash_with_other_sections(optimizer):
    # One parser holds every framework section plus one optimizer and one scheduler.
    for scheduler in LR_SCHEDULER_REGISTRY.names():
        parser = argparse.ArgumentParser()
        sections = [(n, cls, None) for n, cls in SECTIONS.items()]
        sections += [("optimizer", OPTIMIZER_REGISTRY.get(optimizer).config_cls, None),
                     ("lr_scheduler", LR_SCHEDULER_REGISTRY.get(scheduler).config_cls, None)]
        flags.add_sections(parser, sections)
