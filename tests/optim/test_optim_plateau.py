"""``reduce_lr_on_plateau`` against fairseq 0.12's rule (fairseq/optim/lr_scheduler/reduce_lr_on_plateau.py),
written out by hand here."""
import pytest
import torch

from shardtrain.core.errors import ConfigError
from shardtrain.optim import LR_SCHEDULER_REGISTRY


def make(lr=1.0, maximize=False, **values):
    entry = LR_SCHEDULER_REGISTRY.get("reduce_lr_on_plateau")
    w, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([{"params": [w]}, {"params": [b]}], lr=123.0)
    return entry.obj(entry.config_cls(**values), optimizer, lr, 0, maximize=maximize), optimizer


def expected_lrs(losses, lr, shrink, threshold, patience, maximize=False):
    """The lr after each epoch's step: shrink once more than ``patience`` epochs in a row failed to
    beat the best by more than ``threshold`` (relative), then count again."""
    best, bad, out = None, 0, []
    for loss in losses:
        if best is None or (loss > best * (1 + threshold) if maximize else loss < best * (1 - threshold)):
            best, bad = loss, 0
        else:
            bad += 1
        if bad > patience:
            lr, bad = lr * shrink, 0
        out.append(lr)
    return out


LOSSES = [5.0, 4.0, 3.9999, 4.1, 3.5, 3.6, 3.6, 3.4, 3.9]


@pytest.mark.parametrize("patience", [0, 1, 2])
@pytest.mark.parametrize("maximize", [False, True])
def test_plateau_shrinks_as_fairseq(patience, maximize):
    s, opt = make(lr=0.5, maximize=maximize, lr_shrink=0.5, lr_patience=patience)
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.5]
    got = []
    for epoch, loss in enumerate(LOSSES, 1):
        got.append(s.step(epoch, loss))
        assert s.step_update(10 * epoch) == got[-1]  # updates leave it alone after warmup
    assert got == pytest.approx(expected_lrs(LOSSES, 0.5, 0.5, 1e-4, patience, maximize), rel=1e-12)
    assert [g["lr"] for g in opt.param_groups] == [got[-1], got[-1]]


def test_plateau_defaults_are_fairseqs():
    cfg = LR_SCHEDULER_REGISTRY.get("reduce_lr_on_plateau").config_cls()
    assert (cfg.lr_shrink, cfg.lr_threshold, cfg.lr_patience, cfg.warmup_updates, cfg.warmup_init_lr) == \
        (0.1, 1e-4, 0, 0, -1.0)


def test_plateau_warmup_then_plateau_rule():
    s, opt = make(lr=1.0, warmup_updates=4)
    assert opt.param_groups[0]["lr"] == 0.0  # --warmup-init-lr -1 means 0 with warmup
    assert [s.step_update(n) for n in (1, 2, 4)] == pytest.approx([0.25, 0.5, 1.0])
    assert s.step(1, 3.0) == 1.0 and s.step(2, 3.0) == 1.0  # still in warmup: the metric is not seen
    s.step_update(5)  # warmup over
    assert s.step(3, 3.0) == 1.0 and s.step(4, 3.0) == pytest.approx(0.1)
    s2, opt2 = make(lr=1.0, warmup_updates=4, warmup_init_lr=0.2)
    assert s2.step_update(2) == pytest.approx(0.6)


def test_plateau_state_carries_bad_epochs_and_loads_fairseqs():
    s, _ = make(lr=1.0, lr_patience=1)
    s.step(1, 3.0)
    s.step(2, 3.0)  # one bad epoch
    resumed, opt = make(lr=1.0, lr_patience=1)
    resumed.load_state_dict(s.state_dict())
    assert resumed.step(3, 3.0) == pytest.approx(0.1)  # the second bad epoch shrinks, as without the restart
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    from_fairseq, _ = make(lr=1.0)
    from_fairseq.load_state_dict({"best": 2.0, "last_epoch": 5})
    assert from_fairseq.step(6, 2.5) == pytest.approx(0.1)


def test_plateau_refuses_bad_values():
    with pytest.raises(ConfigError, match="--lr-shrink"):
        make(lr_shrink=1.0)
    with pytest.raises(ConfigError, match="--lr-patience"):
        make(lr_patience=-1)
    with pytest.raises(ConfigError, match="--warmup-updates"):
        make(warmup_updates=-1)
