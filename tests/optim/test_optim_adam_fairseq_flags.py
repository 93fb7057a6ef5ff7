"""adam's two other fairseq 0.12 flags (fairseq/optim/adam.py): --use-old-adam picks the plain implementation
instead of the fused kernel, --fp16-adam-stats keeps the moments in fp16."""
import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.optim.cpu_adam import CPUAdam
from shardtrain.optim.optimizers import adam


def build(*flags, device="cpu"):
    cfg = parse_train_args(["data-bin", "--optimizer", "adam", "--adam-eps", "1e-6", *flags]).optimizer
    return adam(cfg, torch.device(device))


def steps(spec, n=5):
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(64))
    optimizer = spec.build([param], lr=0.01)
    for _ in range(n):
        param.grad = torch.randn(64) * 1e-2
        optimizer.step()
    return param.detach(), optimizer


def test_defaults_are_fairseqs():
    cfg = parse_train_args(["data-bin", "--optimizer", "adam"]).optimizer
    assert (cfg.use_old_adam, cfg.fp16_adam_stats) == (False, False)


@pytest.mark.flag_effect("--use-old-adam")
def test_use_old_adam_is_the_plain_implementation_with_the_same_update():
    spec = build("--use-old-adam")
    assert spec.cls is torch.optim.AdamW and spec.kwargs.get("foreach") and not spec.kwargs.get("fused")
    assert build().kwargs.get("fused")
    torch.testing.assert_close(steps(spec)[0], steps(build())[0], rtol=0, atol=1e-6)


@pytest.mark.flag_effect("--fp16-adam-stats")
def test_fp16_adam_stats_keeps_fp16_moments_on_the_cpu():
    spec = build("--fp16-adam-stats", "--weight-decay", "0.1")
    assert spec.cls is CPUAdam and spec.kwargs["fp16_adam_stats"] and spec.kwargs["weight_decay"] == 0.1
    got, optimizer = steps(spec)
    state = next(iter(optimizer.state.values()))
    assert {"exp_avg_fp16", "sqrt_exp_avg_sq_fp16"} <= set(state) and "exp_avg" not in state
    torch.testing.assert_close(got, steps(build("--weight-decay", "0.1"))[0], rtol=0, atol=1e-4)
    with pytest.raises(ConfigError, match="--optimizer cpu_adam --fp16-adam-stats"):
        build("--fp16-adam-stats", device="cuda")
