"""--optimizer and --lr-scheduler at non-default values build what they name (issue 29: every flag tested
at a non-default value). The expected classes and learning rates are written down here: fairseq's
formulas worked by hand, with --lr 1.0 so each rate reads as a fraction of the peak."""
import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.build import build_lr_scheduler, build_optimizer
from shardtrain.trainer.resolved import Components

# --optimizer NAME -> the optimizer object that steps (adam, the default, is torch's AdamW)
OPTIMIZERS = {
    "sgd": "torch.optim.sgd.SGD", "nag": "shardtrain.optim.nag.NAG", "adamw": "torch.optim.adamw.AdamW",
    "adagrad": "torch.optim.adagrad.Adagrad", "adadelta": "torch.optim.adadelta.Adadelta",
    "adamax": "torch.optim.adamax.Adamax", "adafactor": "shardtrain.optim.adafactor.Adafactor",
    "cpu_adam": "shardtrain.optim.cpu_adam.CPUAdam",
}


def built(*flags):
    cfg = parse_train_args(["data-bin", *flags])
    optimizer = build_optimizer(cfg, Components.of(cfg), [torch.nn.Parameter(torch.zeros(3))], torch.device("cpu"))
    return cfg, optimizer


@pytest.mark.flag_effect("--optimizer")
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_each_optimizer_name_builds_its_optimizer(name):
    _, optimizer = built("--optimizer", name)
    assert f"{type(optimizer).__module__}.{type(optimizer).__name__}" == OPTIMIZERS[name]


def lrs(*flags, updates):
    cfg, optimizer = built("--lr", "1.0", *flags)
    scheduler = build_lr_scheduler(cfg, Components.of(cfg), optimizer)
    out = []
    for n in updates:
        scheduler.step_update(n)
        out.append(optimizer.param_groups[0]["lr"])
    return out


@pytest.mark.flag_effect("--lr-scheduler")
def test_each_scheduler_name_shapes_the_learning_rate():
    # inverse_sqrt (the default): linear warmup over 4000 updates, then lr * sqrt(4000 / n)
    assert lrs(updates=[2000, 16000]) == pytest.approx([0.5, 0.5])
    assert lrs("--lr-scheduler", "fixed", updates=[2000, 16000]) == pytest.approx([1.0, 1.0])
    # polynomial_decay: power 1 from the peak to 0 at --max-update
    assert lrs("--lr-scheduler", "polynomial_decay", "--max-update", "100", updates=[50, 75]) == \
        pytest.approx([0.5, 0.25])
    # cosine: half a cosine from the peak towards --min-lr (0) over --lr-period-updates, then a restart at
    # the peak times --lr-shrink (0.1)
    assert lrs("--lr-scheduler", "cosine", "--lr-period-updates", "100", updates=[25, 50, 100]) == \
        pytest.approx([0.5 * (1 + 0.5 ** 0.5), 0.5, 0.1])
