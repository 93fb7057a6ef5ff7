"""``nag`` against fairseq 0.12's formula (fairseq/optim/nag.py), written out by hand here."""
import pytest
import torch

from shardtrain.optim import OPTIMIZER_REGISTRY
from shardtrain.optim.nag import NAG

# As a warmup from 0 gives it (inverse_sqrt's first update runs at lr 0), then changing: fairseq's buffer is
# rescaled by lr / lr_old, and an update at lr 0 leaves it empty (torch's SGD(nesterov=True) keeps g in it).
LRS = [0.0, 0.1, 0.05, 0.2, 0.2]
PEAK = 0.1  # the optimizer is built with --lr; the scheduler then sets LRS


def reference(weights, grads, lrs, momentum, weight_decay):
    """fairseq's NAG on plain Python floats, one weight at a time."""
    weights, buf, lr_old = list(weights), [0.0] * len(weights), PEAK
    for grad, lr in zip(grads, lrs):
        correct = lr / lr_old if lr_old > 0 else lr
        for i, g in enumerate(grad):
            w = weights[i] * (1 - lr * weight_decay)
            weights[i] = w + momentum * momentum * correct * buf[i] - (1 + momentum) * lr * g
            buf[i] = momentum * correct * buf[i] - lr * g
        lr_old = lr
    return weights


def run(optimizer, param, grads, lrs):
    for grad, lr in zip(grads, lrs):
        for group in optimizer.param_groups:
            group["lr"] = lr
        param.grad = torch.tensor(grad, dtype=param.dtype)
        optimizer.step()


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_nag_steps_as_fairseqs_formula_with_a_changing_lr(weight_decay):
    torch.manual_seed(0)
    start = [0.5, -1.0, 2.0]
    grads = torch.randn(len(LRS), 3, dtype=torch.float64).tolist()
    param = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    run(NAG([param], lr=PEAK, momentum=0.9, weight_decay=weight_decay), param, grads, LRS)
    expected = reference(start, grads, LRS, 0.9, weight_decay)
    torch.testing.assert_close(param.detach(), torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # and not torch's SGD(nesterov=True), which keeps the gradient of the lr-0 update in its buffer
    sgd_param = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    run(torch.optim.SGD([sgd_param], lr=PEAK, momentum=0.9, nesterov=True), sgd_param, grads, LRS)
    assert not torch.allclose(sgd_param.detach(), param.detach())


def test_nag_registry_defaults_are_fairseqs():
    entry = OPTIMIZER_REGISTRY.get("nag")
    cfg = entry.config_cls()
    assert (cfg.momentum, cfg.weight_decay) == (0.99, 0.0)
    optimizer = entry.obj(cfg, torch.device("cpu")).build([torch.nn.Parameter(torch.zeros(2))], lr=0.25)
    assert isinstance(optimizer, NAG)
    assert optimizer.param_groups[0]["momentum"] == 0.99
    assert optimizer.param_groups[0]["lr_old"] == 0.25


def test_nag_resumes_with_its_buffer_and_lr_old():
    torch.manual_seed(1)
    grads = torch.randn(len(LRS), 3, dtype=torch.float64).tolist()
    start = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    whole = torch.nn.Parameter(start.clone())
    run(NAG([whole], lr=PEAK, momentum=0.9), whole, grads, LRS)
    first = torch.nn.Parameter(start.clone())
    opt = NAG([first], lr=PEAK, momentum=0.9)
    run(opt, first, grads[:3], LRS[:3])
    second = torch.nn.Parameter(first.detach().clone())
    resumed = NAG([second], lr=1.0, momentum=0.5)  # the saved groups bring lr, lr_old and momentum
    resumed.load_state_dict(opt.state_dict())
    run(resumed, second, grads[3:], LRS[3:])
    torch.testing.assert_close(second.detach(), whole.detach(), rtol=0, atol=0)


def test_nag_steps_fp16_parameters_in_fp32():
    param = torch.nn.Parameter(torch.tensor([1.0, -1.0], dtype=torch.float16))
    opt = NAG([param], lr=0.1, momentum=0.9)
    run(opt, param, [[1e-3, 2e-3]] * 3, [0.1] * 3)
    assert param.dtype == torch.float16
    assert opt.state[param]["momentum_buffer"].dtype == torch.float32
    expected = reference([1.0, -1.0], [[1e-3, 2e-3]] * 3, [0.1] * 3, 0.9, 0.0)
    torch.testing.assert_close(param.detach().float(), torch.tensor(expected, dtype=torch.float32),
                               rtol=0, atol=1e-3)
