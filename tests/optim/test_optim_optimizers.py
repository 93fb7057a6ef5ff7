"""Optimizers built from the registry equal the torch optimizers they stand for."""
import argparse
import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from shardtrain.config import flags
from shardtrain.core.errors import ConfigError
from shardtrain.optim import OPTIMIZER_REGISTRY, OptimizerSpec
from shardtrain.optim.optimizers import implementation_kwargs, parse_float_tuple

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
LR = 0.01

# name -> (non-default flag values, the torch optimizer and kwargs they must equal).
# The reference uses torch's default (single-tensor/foreach) implementation, so
# a fused kernel picked by the registry is checked against it too.
CASES = {
    "adam": ({"adam_betas": (0.8, 0.95), "adam_eps": 1e-6, "weight_decay": 0.1},
             torch.optim.AdamW, dict(betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    "adamw": ({"adam_betas": (0.9, 0.98)}, torch.optim.AdamW, dict(betas=(0.9, 0.98), weight_decay=0.01)),
    "sgd": ({"momentum": 0.9, "weight_decay": 0.01}, torch.optim.SGD, dict(momentum=0.9, weight_decay=0.01)),
    "adagrad": ({"weight_decay": 0.01}, torch.optim.Adagrad, dict(weight_decay=0.01)),
    "adadelta": ({"adadelta_rho": 0.8, "adadelta_eps": 1e-5, "weight_decay": 0.01},
                 torch.optim.Adadelta, dict(rho=0.8, eps=1e-5, weight_decay=0.01)),
    "adamax": ({"adamax_betas": (0.85, 0.99), "adamax_eps": 1e-7, "weight_decay": 0.01},
               torch.optim.Adamax, dict(betas=(0.85, 0.99), eps=1e-7, weight_decay=0.01)),
}


def make_cfg(name, **values):
    return OPTIMIZER_REGISTRY.get(name).config_cls(**values)


def build_spec(name, device="cpu", **values) -> OptimizerSpec:
    return OPTIMIZER_REGISTRY.get(name).obj(make_cfg(name, **values), torch.device(device))


def train_params(make_optimizer, device, steps=5):
    """Parameters of a tiny model after ``steps`` updates on a fixed batch."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(device)
    x = torch.randn(16, 4, device=device)
    y = torch.randn(16, 2, device=device)
    optimizer = make_optimizer(model.parameters())
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return [p.detach().cpu() for p in model.parameters()], optimizer


def assert_params_close(got, expected):
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_registry_optimizer_equals_torch(name, device):
    values, ref_cls, ref_kwargs = CASES[name]
    spec = build_spec(name, device, **values)
    got, optimizer = train_params(lambda p: spec.build(p, LR), device)
    expected, _ = train_params(lambda p: ref_cls(p, lr=LR, **ref_kwargs), device)
    assert type(optimizer) is ref_cls
    assert optimizer.param_groups[0]["lr"] == LR
    assert_params_close(got, expected)
    initial, _ = train_params(lambda p: ref_cls(p, lr=LR, **ref_kwargs), device, steps=0)
    assert any((g - i).abs().max() > 1e-4 for g, i in zip(got, initial)), "the optimizer did not move the params"


# With every flag at its default, the torch optimizer each name must equal.
DEFAULT_REFERENCES = {
    "adam": (torch.optim.AdamW, dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)),
    "adamw": (torch.optim.AdamW, dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)),
    "sgd": (torch.optim.SGD, dict(momentum=0.0, weight_decay=0.0)),
    "adagrad": (torch.optim.Adagrad, dict(weight_decay=0.0)),
    "adadelta": (torch.optim.Adadelta, dict(rho=0.9, eps=1e-6, weight_decay=0.0)),
    "adamax": (torch.optim.Adamax, dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)),
}


@pytest.mark.parametrize("name", sorted(DEFAULT_REFERENCES))
def test_defaults_equal_torch(name):
    ref_cls, ref_kwargs = DEFAULT_REFERENCES[name]
    spec = build_spec(name)
    got, _ = train_params(lambda p: spec.build(p, LR), "cpu")
    expected, _ = train_params(lambda p: ref_cls(p, lr=LR, **ref_kwargs), "cpu")
    assert spec.cls is ref_cls
    assert_params_close(got, expected)


def test_adam_modes_match_adamw_and_adam():
    torch_cls = {True: torch.optim.AdamW, False: torch.optim.Adam}
    results = {}
    for adamw_mode, cls in torch_cls.items():
        spec = build_spec("adam", weight_decay=0.5, adamw_mode=adamw_mode)
        assert spec.cls is cls
        results[adamw_mode], _ = train_params(lambda p: spec.build(p, LR), "cpu")
        expected, _ = train_params(lambda p: cls(p, lr=LR, weight_decay=0.5), "cpu")
        assert_params_close(results[adamw_mode], expected)
    # Decoupled and L2 weight decay must really differ, or the test above proves nothing.
    assert any((a - b).abs().max() > 1e-5 for a, b in zip(results[True], results[False]))


def test_default_values_are_fairseqs():
    assert make_cfg("adam").adam_betas == (0.9, 0.999) and make_cfg("adam").adam_eps == 1e-8
    assert make_cfg("adam").weight_decay == 0.0 and make_cfg("adam").adamw_mode is True
    assert make_cfg("adamw").weight_decay == 0.01
    assert make_cfg("sgd").momentum == 0.0
    assert (make_cfg("adadelta").adadelta_rho, make_cfg("adadelta").adadelta_eps) == (0.9, 1e-6)
    assert (make_cfg("adamax").adamax_betas, make_cfg("adamax").adamax_eps) == ((0.9, 0.999), 1e-8)


def test_fused_where_torch_has_a_kernel_else_foreach():
    for name in ("adam", "adamw", "sgd", "adagrad"):
        cpu = build_spec(name, "cpu").kwargs
        assert cpu["fused"] is True and "foreach" not in cpu, name
        meta = build_spec(name, "meta").kwargs  # no fused kernels on meta tensors
        assert meta["foreach"] is True and "fused" not in meta, name
    for name in ("adadelta", "adamax"):  # torch has no fused kernel for these
        kwargs = build_spec(name, "cpu").kwargs
        assert kwargs["foreach"] is True and "fused" not in kwargs, name
    assert implementation_kwargs(torch.optim.AdamW, torch.device("cuda")) == {"fused": True}
    assert implementation_kwargs(torch.optim.Adam, torch.device("mps")) == {"foreach": True}


def test_betas_accept_strings_and_reject_malformed():
    spec = build_spec("adam", adam_betas="(0.9, 0.98)")
    assert spec.kwargs["betas"] == (0.9, 0.98)
    assert build_spec("adamax", adamax_betas=[0.5, 0.6]).kwargs["betas"] == (0.5, 0.6)
    for bad in ("0.9", "(0.9, 0.98, 0.99)", "(0.9, oops)", "(0.9,", (0.9,)):
        with pytest.raises(ConfigError, match=r"--adam-betas must be 2 numbers.*e\.g\. --adam-betas"):
            build_spec("adam", adam_betas=bad)
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        build_spec("adamw", adam_betas=(0.9, 1.5))
    assert parse_float_tuple("[1, 2, 3]", "--x", (0.0, 0.0, 0.0)) == (1.0, 2.0, 3.0)


def test_invalid_values_raise_config_error_naming_the_flag():
    with pytest.raises(ConfigError, match="--weight-decay is -0.1"):
        build_spec("sgd", weight_decay=-0.1)
    with pytest.raises(ConfigError, match="--adam-eps"):
        build_spec("adam", adam_eps=-1.0)
    with pytest.raises(ConfigError, match="--adadelta-rho"):
        build_spec("adadelta", adadelta_rho=1.5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_dataclasses_work_with_omegaconf_and_the_flag_generator(name):
    config_cls = OPTIMIZER_REGISTRY.get(name).config_cls
    assert all(f.metadata.get("help") for f in dataclasses.fields(config_cls))
    parser = argparse.ArgumentParser()
    flags.add_dataclass_flags(parser, "optimizer", config_cls)
    values = flags.section_values(parser.parse_args([]), "optimizer")
    cfg = OmegaConf.merge(OmegaConf.structured(config_cls), values)  # what the CLI hands the builder
    spec = OPTIMIZER_REGISTRY.get(name).obj(cfg, torch.device("cpu"))
    assert spec.cls is CASES[name][1] or (name, spec.cls) == ("adam", torch.optim.AdamW)


def test_flags_reach_the_optimizer():
    config_cls = OPTIMIZER_REGISTRY.get("adam").config_cls
    parser = argparse.ArgumentParser()
    flags.add_dataclass_flags(parser, "optimizer", config_cls)
    args = parser.parse_args(["--adam-betas", "(0.9, 0.98)", "--no-adamw-mode", "--weight-decay", "0.1"])
    cfg = OmegaConf.merge(OmegaConf.structured(config_cls), flags.section_values(args, "optimizer"))
    spec = OPTIMIZER_REGISTRY.get("adam").obj(cfg, torch.device("cpu"))
    assert spec.cls is torch.optim.Adam
    assert spec.kwargs["betas"] == (0.9, 0.98) and spec.kwargs["weight_decay"] == 0.1
