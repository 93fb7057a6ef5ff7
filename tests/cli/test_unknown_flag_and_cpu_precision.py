"""A mistyped flag gets the nearest known flags (every command's parser); --fp16 on a CPU says what it costs
(issue 31, item 6)."""
import types

import pytest

from shardtrain.cli import demo, hydra_train, train, validate
from shardtrain.trainer.precision import cpu_speed as cpu_precision
from shardtrain.config.flags import unrecognized_message
from st_testutils import cli_refusal


@pytest.mark.parametrize("main,argv,expected", [
    (train.main, ["data-bin", "--lrr", "0.1"], "--lrr: did you mean --lr?"),
    (train.main, ["data-bin", "--max-updates", "3"], "--max-updates: did you mean --max-update"),
    (train.main, ["data-bin", "--save-dirr=x"], "--save-dirr: did you mean --save-dir or"),
    (validate.main, ["data-bin", "--path", "x.pt", "--batch-sise", "2"], "--batch-sise: did you mean --batch-size"),
    (hydra_train.main, ["--config-nam", "x"], "--config-nam: did you mean --config-name"),
    (demo.main, ["--workdirr", "x"], "--workdirr: did you mean --workdir?"),
])
def test_a_mistyped_flag_gets_the_nearest_known_flag(main, argv, expected, capsys):
    _, err = cli_refusal(main, argv, capsys)
    line = err.splitlines()[-1]
    assert "error: unrecognized arguments: " in line and expected in line and "--help lists the flags" in line


def test_a_flag_like_no_other_gets_no_guess():
    text = unrecognized_message("unrecognized arguments: --zzqq 3", ["--lr", "--seed"], "shard-train")
    assert text == ("unrecognized arguments: --zzqq 3. Remove or correct the flag (shard-train --help lists the "
                    "flags).")
    text = unrecognized_message("unrecognized arguments: --sed -1", ["--lr", "--seed"], "shard-train")
    assert "--sed: did you mean --seed?" in text and "-1:" not in text


def common(**set_flags):
    names = ("fp16", "bf16", "memory_efficient_fp16", "memory_efficient_bf16", "amp")
    return types.SimpleNamespace(**{name: set_flags.get(name, False) for name in names})


def test_fp16_on_a_cpu_says_the_cost_and_when_bf16_helps():
    plain = cpu_precision.warning(common(fp16=True), on_cpu=True, flags={"avx2"})
    assert plain.startswith("warning: --fp16 on a CPU: ") and "about 60x slower than in float32" in plain
    assert "Drop --fp16 to train in float32" in plain and "--bf16" in plain and "this one lacks" in plain
    amx = cpu_precision.warning(common(fp16=True), on_cpu=True, flags={"avx2", "amx_bf16"})
    assert "or pass --bf16 instead: this CPU has bfloat16 instructions" in amx
    unknown = cpu_precision.warning(common(amp=True), on_cpu=True, flags=None)
    assert unknown.startswith("warning: --amp on a CPU") and "does not say it has" in unknown
    assert cpu_precision.warning(common(fp16=True), on_cpu=False, flags={"avx2"}) is None  # a GPU run
    assert cpu_precision.warning(common(), on_cpu=True, flags={"avx2"}) is None  # fp32
    slow_bf16 = cpu_precision.warning(common(bf16=True), on_cpu=True, flags={"avx2"})
    assert slow_bf16.startswith("warning: --bf16 on a CPU without bfloat16 instructions")
    assert cpu_precision.warning(common(bf16=True), on_cpu=True, flags={"avx512_bf16"}) is None


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\n")
    assert cpu_precision.cpu_flags(str(tmp_path / "cpuinfo")) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_precision.cpu_flags(str(tmp_path / "missing")) is None


def test_shard_train_prints_the_warning_before_the_run(capsys, monkeypatch):
    runs = []
    monkeypatch.setattr(train.start, "call_main", lambda cfg, main: runs.append(cfg))
    monkeypatch.setattr(train.preflight, "check_before_launch", lambda cfg: None)  # no data-bin here
    monkeypatch.setattr(cpu_precision, "cpu_flags", lambda: {"avx2"})
    train.main(["data-bin", "--cpu", "--fp16"])
    err = capsys.readouterr().err
    assert len(runs) == 1 and err.startswith("shard-train: warning: --fp16 on a CPU: ")
    train.main(["data-bin", "--cpu"])
    assert "warning" not in capsys.readouterr().err
