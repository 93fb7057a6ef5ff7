import dataclasses

import pytest

from shardtrain.core.errors import ConfigError
from shardtrain.core.registry import Registry


def test_register_get_and_config_class():
    reg = Registry("widget")

    @dataclasses.dataclass
    class Cfg:
        size: int = 1

    @reg.register("round", dataclass=Cfg)
    class Round:
        pass

    entry = reg.get("round")
    assert entry.obj is Round and entry.config_cls is Cfg and entry.name == "round"
    assert "round" in reg and reg.names() == ["round"]


def test_duplicate_name_is_an_error():
    reg = Registry("widget")
    reg.add("a", object)
    with pytest.raises(ConfigError, match="already taken"):
        reg.add("a", int)


def test_unknown_name_lists_choices_and_nearest_match():
    reg = Registry("optimizer")
    for name in ("adam", "adamw", "sgd"):
        reg.add(name, object)
    with pytest.raises(ConfigError) as info:
        reg.get("adma")
    message = str(info.value)
    assert "Did you mean 'adam'?" in message
    assert "adam, adamw, sgd" in message and "--optimizer" in message


def test_non_dataclass_config_is_rejected():
    with pytest.raises(TypeError):
        Registry("x").register("a", dataclass=int)


def test_builtin_registries_hold_the_issue_components():
    from shardtrain.config.components import registries

    regs = registries()
    assert "language_modeling" in regs["task"]
    assert {"cross_entropy", "label_smoothed_cross_entropy"} <= set(regs["criterion"].names())
    assert {"adam", "adamw", "sgd", "adagrad", "adadelta", "adamax"} <= set(regs["optimizer"].names())
    assert {"fixed", "inverse_sqrt", "polynomial_decay", "cosine", "tri_stage"} <= set(regs["lr_scheduler"].names())
    archs = set(regs["model"][1].names())
    for size in ("gpt", "gpt2_small", "gpt2_medium", "gpt2_big", "gpt3_small", "gpt3_medium", "gpt3_large",
                 "gpt3_xl", "gpt3_2_7", "gpt3_6_7", "gpt3_13", "gpt3_175"):
        assert f"transformer_lm_{size}" in archs
