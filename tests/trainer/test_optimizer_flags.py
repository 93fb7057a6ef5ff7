"""Every optimizer flag, given on shard-train's command line, changes the update the way its reference says.

The path is the CLI's: flags parsed by ``parse_train_args``, the optimizer built by the trainer's
``build_optimizer``. Three updates of a four-element tensor with hand-written gradients are compared with
``torch.optim``'s optimizer given the same values (fairseq's optimizers are torch's, see
shardtrain/optim/optimizers.py), or for ``nag`` with fairseq's formula worked out by hand; and the flag's
value must really change the result (it differs from the run without the flag).
"""
import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.build import build_optimizer
from shardtrain.trainer.resolved import Components

LR = 0.1
START = [1.0, -2.0, 0.5, 3.0]
# Mixed magnitudes: the 1e-4-sized entries make an eps of 0.1 visible, the sign changes make betas,
# rho and momentum visible from the second update on.
GRADS = [[0.1, -0.2, 1e-4, 0.5], [0.3, 0.1, -1e-4, -0.2], [-0.2, 0.4, 2e-4, 0.1]]


def run(make_optimizer, grads=GRADS, start=START):
    param = torch.nn.Parameter(torch.tensor(start))
    optimizer = make_optimizer([param])
    for grad in grads:
        param.grad = torch.tensor(grad)
        optimizer.step()
    return param.detach(), optimizer


def shard_train(*flags):
    cfg = parse_train_args(["data-bin", "--lr", str(LR), *flags])
    return lambda params: build_optimizer(cfg, Components.of(cfg), params, torch.device("cpu"))


def torch_optim(cls, **kwargs):
    return lambda params: cls(params, lr=LR, **kwargs)


# (optimizer, the flag and its non-default value, the torch optimizer with the values these flags must give)
CASES = [
    ("adam", ["--adam-betas", "(0.5, 0.6)"], torch.optim.AdamW, dict(betas=(0.5, 0.6), weight_decay=0.0)),
    ("adam", ["--adam-eps", "0.1"], torch.optim.AdamW, dict(eps=0.1, weight_decay=0.0)),
    ("adam", ["--weight-decay", "0.5"], torch.optim.AdamW, dict(weight_decay=0.5)),
    ("adam", ["--no-adamw-mode", "--weight-decay", "0.5"], torch.optim.Adam, dict(weight_decay=0.5)),
    ("adamw", ["--adam-betas", "(0.5, 0.6)"], torch.optim.AdamW, dict(betas=(0.5, 0.6))),
    ("adamw", ["--adam-eps", "0.1"], torch.optim.AdamW, dict(eps=0.1)),
    ("adamw", ["--weight-decay", "0.5"], torch.optim.AdamW, dict(weight_decay=0.5)),
    ("cpu_adam", ["--adam-betas", "(0.5, 0.6)"], torch.optim.AdamW, dict(betas=(0.5, 0.6), weight_decay=0.0)),
    ("cpu_adam", ["--adam-eps", "0.1"], torch.optim.AdamW, dict(eps=0.1, weight_decay=0.0)),
    ("cpu_adam", ["--weight-decay", "0.5"], torch.optim.AdamW, dict(weight_decay=0.5)),
    ("cpu_adam", ["--no-adamw-mode", "--weight-decay", "0.5"], torch.optim.Adam, dict(weight_decay=0.5)),
    ("sgd", ["--momentum", "0.5"], torch.optim.SGD, dict(momentum=0.5)),
    ("sgd", ["--weight-decay", "0.5"], torch.optim.SGD, dict(weight_decay=0.5)),
    ("sgd", ["--wd", "0.5"], torch.optim.SGD, dict(weight_decay=0.5)),
    ("adagrad", ["--weight-decay", "0.5"], torch.optim.Adagrad, dict(weight_decay=0.5)),
    ("adadelta", ["--adadelta-rho", "0.5"], torch.optim.Adadelta, dict(rho=0.5)),
    ("adadelta", ["--adadelta-eps", "0.1"], torch.optim.Adadelta, dict(eps=0.1)),
    ("adadelta", ["--weight-decay", "0.5"], torch.optim.Adadelta, dict(weight_decay=0.5)),
    ("adamax", ["--adamax-betas", "(0.5, 0.6)"], torch.optim.Adamax, dict(betas=(0.5, 0.6))),
    ("adamax", ["--adamax-eps", "0.1"], torch.optim.Adamax, dict(eps=0.1)),
    ("adamax", ["--weight-decay", "0.5"], torch.optim.Adamax, dict(weight_decay=0.5)),
]


@pytest.mark.flag_effect("--adam-betas", "--adam-eps", "--weight-decay", "--no-adamw-mode", "--momentum",
                         "--adadelta-rho", "--adadelta-eps", "--adamax-betas", "--adamax-eps")
@pytest.mark.parametrize("name, flags, cls, kwargs", CASES, ids=[f"{c[0]}{' '.join(c[1])}" for c in CASES])
def test_flag_gives_torch_optimizers_update(name, flags, cls, kwargs):
    got, optimizer = run(shard_train("--optimizer", name, *flags))
    expected, _ = run(torch_optim(cls, **kwargs))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert optimizer.param_groups[0]["lr"] == LR
    without_flag, _ = run(shard_train("--optimizer", name))
    assert (got - without_flag).abs().max() > 1e-4, f"{' '.join(flags)} did not change {name}'s update"


def test_adam_mode_changes_the_update_only_with_weight_decay():
    # Or the --no-adamw-mode cases above would prove nothing: L2 and decoupled decay must differ.
    l2, _ = run(shard_train("--optimizer", "adam", "--no-adamw-mode", "--weight-decay", "0.5"))
    decoupled, _ = run(shard_train("--optimizer", "adam", "--weight-decay", "0.5"))
    assert (l2 - decoupled).abs().max() > 1e-3


@pytest.mark.flag_effect("--momentum")
def test_nag_momentum_by_hand():
    # fairseq's nag with lr 0.1, momentum m = 0.5, gradient 1 twice (buffer b starts at 0):
    # p = 1 + m*m*b - (1 + m) * lr * g = 1 - 0.15 = 0.85;  b = m*b - lr*g = -0.1
    # p = 0.85 + 0.25 * (-0.1) - 0.15 = 0.675
    got, _ = run(shard_train("--optimizer", "nag", "--momentum", "0.5"), grads=[[1.0], [1.0]], start=[1.0])
    assert got.tolist() == pytest.approx([0.675], abs=1e-6)
    # the default momentum 0.99: p = 1 - 1.99 * 0.1 = 0.801 after the first update
    first, _ = run(shard_train("--optimizer", "nag"), grads=[[1.0]], start=[1.0])
    assert first.tolist() == pytest.approx([0.801], abs=1e-6)


@pytest.mark.flag_effect("--weight-decay")
def test_nag_weight_decay_shrinks_the_weights_by_lr_times_decay():
    # momentum 0: p = p * (1 - lr * wd) - lr * g = 1 * 0.95 - 0.1 = 0.85, then 0.85 * 0.95 - 0.1 = 0.7075
    got, _ = run(shard_train("--optimizer", "nag", "--momentum", "0", "--weight-decay", "0.5"),
                 grads=[[1.0], [1.0]], start=[1.0])
    assert got.tolist() == pytest.approx([0.7075], abs=1e-6)
    no_decay, _ = run(shard_train("--optimizer", "nag", "--momentum", "0"), grads=[[1.0], [1.0]], start=[1.0])
    assert no_decay.tolist() == pytest.approx([0.8], abs=1e-6)


@pytest.mark.flag_effect("--fp16-adam-stats")
def test_cpu_adam_fp16_adam_stats_keeps_fp16_moments():
    got, optimizer = run(shard_train("--optimizer", "cpu_adam", "--fp16-adam-stats"))
    state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    assert {k: v.dtype for k, v in state.items() if k != "step"} == {
        "exp_avg_fp16": torch.float16, "sqrt_exp_avg_sq_fp16": torch.float16}
    expected, _ = run(torch_optim(torch.optim.AdamW, weight_decay=0.0))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-3)  # fp16 moments: close, not equal
    _, fp32 = run(shard_train("--optimizer", "cpu_adam"))
    assert "exp_avg" in fp32.state[fp32.param_groups[0]["params"][0]]
