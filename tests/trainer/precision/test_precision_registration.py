"""A precision's attributes are checked once, when it registers (red team 4.5, 4.12): a compute that is not a
dtype autocast computes in, a flag that is not True/False, flags that are not a tuple of names, and a flag
another precision already has are each one paragraph naming the precision, and nothing is registered; a build()
that returns no component is refused when the run builds it. Through --user-dir, shard-train and shard-plan
refuse such a plugin with exit 2 and no traceback."""
import types

import pytest
import torch

from shardtrain.cli import plan, train
from shardtrain.core.errors import ConfigError
from shardtrain.trainer.precision import choose, fp32
from shardtrain.trainer.precision.registry import PRECISION_REGISTRY, PrecisionKind, register_precision
from st_testutils import cli_refusal, small_data_bin


@pytest.mark.parametrize("attributes, said", [
    ({"compute": "bfloat16"}, "its compute is 'bfloat16' (str): it must be None (float32) or torch.float16 or "
                              "torch.bfloat16"),
    ({"compute": torch.int8}, "its compute is torch.int8 (dtype): it must be None"),
    ({"compute": torch.float64}, "its compute is torch.float64 (dtype): it must be None"),
    ({"loss_scaled": "yes"}, "loss_scaled is 'yes': it must be True or False"),
    ({"flags": "my_fp8"}, "flags is 'my_fp8': it must be a tuple of names"),
    ({"implies": ("fp16", None)}, "implies is ('fp16', None): it must be a tuple of names"),
    ({"implies": ("fp16", 3)}, "implies is ('fp16', 3): it must be a tuple of names"),
    ({"flags": ("",)}, "flags is ('',): it must be a tuple of names"),
    ({"flags": ("fp16",)}, "its flag --fp16 already picks the precision 'fp16', and a flag picks one precision: give "
                           "it a flag of its own (a CommonConfig field) or none (--precision NAME picks it)."),
    ({"flags": ("memory_efficient_fp16",)}, "its flag --memory-efficient-fp16 already picks the precision "
                                            "'memory_efficient_fp16'"),
])
def test_a_precision_with_a_wrong_attribute_is_refused_at_registration(attributes, said):
    kind = type("BadKind", (PrecisionKind,), attributes)
    with pytest.raises(ConfigError) as refused:
        register_precision("st_bad_precision")(kind)
    text = str(refused.value)
    assert text.startswith(f"Precision 'st_bad_precision' ({__name__}.BadKind) cannot be registered: {said}"), text
    assert "\n" not in text and text.endswith("Fix the class's attributes and run again.")
    assert "st_bad_precision" not in choose.user_choices()


def test_a_good_precision_registers_under_its_name(monkeypatch):
    monkeypatch.setattr(PRECISION_REGISTRY, "_entries", dict(PRECISION_REGISTRY._entries))  # gone after the test
    kind = type("GoodKind", (PrecisionKind,), {"flags": ("st_good_flag",), "compute": torch.bfloat16})
    assert register_precision("st_good_precision")(kind) is kind
    assert kind.name == "st_good_precision" and PRECISION_REGISTRY.get("st_good_precision").obj is kind
    with pytest.raises(NotImplementedError, match="^precision 'st_good_precision' builds no component$"):
        kind.build(None, None, None)


def test_only_a_precision_kind_registers():
    with pytest.raises(TypeError, match=r"^precision 'st_int': register a PrecisionKind subclass, got <class 'int'>$"):
        register_precision("st_int")(int)
    assert "st_int" not in PRECISION_REGISTRY


def test_a_build_that_returns_no_component_is_refused(monkeypatch):
    monkeypatch.setattr(fp32.FP32, "build", classmethod(lambda cls, cfg, backend, dtypes: None))
    dtypes = types.SimpleNamespace(name="fp32")
    with pytest.raises(ConfigError, match=r"Precision 'fp32' \(shardtrain.trainer.precision.fp32.FP32\): its "
                                          r"build\(cfg, backend, dtypes\) returned None, not a shardtrain"):
        choose.build_precision(None, None, dtypes)


BAD_PLUGIN = """import torch
from shardtrain.trainer.precision.registry import PrecisionKind, register_precision

@register_precision("{name}")
class StringDtype(PrecisionKind):
    compute = "bfloat16"
"""


@pytest.mark.parametrize("command", ["shard-train", "shard-plan"])
def test_a_plugin_with_a_string_dtype_is_one_paragraph(tmp_path, capsys, command):
    plugin = tmp_path / f"st_string_dtype_{command[6:]}"
    plugin.mkdir()
    (plugin / "__init__.py").write_text(BAD_PLUGIN.format(name=plugin.name))
    main = {"shard-train": train.main, "shard-plan": plan.main}[command]
    data = small_data_bin(str(tmp_path / "data"))  # shard-plan reads the data before the plugin
    _, err = cli_refusal(main, [data, "--user-dir", str(plugin)], capsys)
    assert f"Precision '{plugin.name}' ({plugin.name}.StringDtype) cannot be registered: its compute is " \
           "'bfloat16' (str)" in err and ".." not in err, err
