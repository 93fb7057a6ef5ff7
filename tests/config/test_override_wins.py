"""A command-line override wins over the recipe's value it contradicts (issue 37, item 5):
``--config-name lm_fully_sharded checkpoint.no_save=true`` runs and saves nothing, with a notice that the
recipe's checkpoint.save_interval_updates is ignored; two contradicting values from one place are still refused."""
import os

import pytest

from shardtrain.cli import hydra_train
from shardtrain.config import hydra_files, override_wins
from shardtrain.core.errors import ConfigError
from st_testutils import json_records, make_space_data_bin

RECIPE = os.path.join(hydra_files.RECIPES_DIR, "lm_fully_sharded.yaml")


def hydra_config(*argv):
    return hydra_train.build_config(hydra_train.parse_command_line(list(argv)))


def notices(capsys):
    return [" ".join(line.split()) for line in capsys.readouterr().err.splitlines() if "notice:" in line]


def test_no_save_override_wins_over_the_recipes_save_interval(capsys):
    cfg = hydra_config("--config-name", "lm_fully_sharded", "task.data=d", "checkpoint.no_save=true")
    assert cfg.checkpoint.no_save is True and cfg.checkpoint.save_interval_updates == 0
    assert cfg.checkpoint.keep_interval_updates == 2  # the rest of the recipe's section stays
    assert notices(capsys) == [
        "shard-hydra-train: notice: checkpoint.no_save=true wins over checkpoint.save_interval_updates=100 set in "
        f"the config {RECIPE}, which is ignored (checkpoint.save_interval_updates=0)"]


def test_an_interval_override_wins_over_a_recipes_no_save(tmp_path, capsys):
    (tmp_path / "quiet.yaml").write_text("defaults:\n  - shardtrain\n  - _self_\ntask:\n  data: d\n"
                                         "checkpoint:\n  no_save: true\n")
    cfg = hydra_config("--config-dir", str(tmp_path), "--config-name", "quiet", "checkpoint.save_interval_updates=7")
    assert cfg.checkpoint.no_save is False and cfg.checkpoint.save_interval_updates == 7
    assert notices(capsys) == [
        "shard-hydra-train: notice: checkpoint.save_interval_updates=7 wins over checkpoint.no_save=true set in the "
        f"config {tmp_path}/quiet.yaml, which is ignored (checkpoint.no_save=false)"]


def test_both_from_one_place_are_still_refused(tmp_path):
    with pytest.raises(ConfigError, match="--no-save and --save-interval-updates contradict each other"):
        hydra_config("--config-name", "lm_fully_sharded", "task.data=d", "checkpoint.no_save=true",
                     "checkpoint.save_interval_updates=50")
    (tmp_path / "both.yaml").write_text("defaults:\n  - shardtrain\n  - _self_\ntask:\n  data: d\n"
                                        "checkpoint:\n  no_save: true\n  save_interval_updates: 5\n")
    with pytest.raises(ConfigError, match="--no-save and --save-interval-updates contradict each other"):
        hydra_config("--config-dir", str(tmp_path), "--config-name", "both")


@pytest.mark.slow
def test_the_recipe_with_no_save_trains_and_saves_nothing(tmp_path, monkeypatch, capsys):
    data = make_space_data_bin(str(tmp_path), n_words=8, train_tokens=1500, valid_tokens=200, line_len=40, seed=3)
    monkeypatch.chdir(tmp_path)
    log = str(tmp_path / "log")
    hydra_train.main(["--config-name", "lm_fully_sharded", f"task.data={data}", "checkpoint.no_save=true",
                      "optimization.max_update=2", "lr_scheduler.warmup_updates=1", "dataset.batch_size=4",
                      "task.tokens_per_sample=32", "common.log_format=json", "common.log_interval=1",
                      f"common.log_file={log}", "common.threads=1"])
    assert [r["num_updates"] for r in json_records(log, "train_inner")] == [1, 2]
    assert not os.path.exists(tmp_path / "checkpoints")  # the recipe's save_dir: nothing saved, not even made
    assert "checkpoint.save_interval_updates=100 set in the config" in " ".join(capsys.readouterr().err.split())


def test_a_precision_override_wins_over_the_files_other_precision(tmp_path, capsys):
    (tmp_path / "bf16.yaml").write_text("defaults:\n  - shardtrain\n  - _self_\ntask:\n  data: d\n"
                                        "common:\n  bf16: true\n")
    cfg = hydra_config("--config-dir", str(tmp_path), "--config-name", "bf16", "common.fp16=true")
    assert cfg.common.fp16 is True and cfg.common.bf16 is False
    assert notices(capsys) == [
        "shard-hydra-train: notice: common.fp16=true wins over common.bf16=true set in the config "
        f"{tmp_path}/bf16.yaml, which is ignored (common.bf16=false)"]
    with pytest.raises(ConfigError, match=r"^--bf16 and --fp16 both pick the precision, and differently \(bf16 vs fp16\)"):
        hydra_config("--config-dir", str(tmp_path), "--config-name", "bf16", "common.fp16=true", "common.bf16=true")


def test_a_precision_by_name_override_wins_over_the_files_bf16(tmp_path, capsys):
    (tmp_path / "bf16.yaml").write_text("defaults:\n  - shardtrain\n  - _self_\ntask:\n  data: d\n"
                                        "common:\n  bf16: true\n")
    cfg = hydra_config("--config-dir", str(tmp_path), "--config-name", "bf16", "common.precision=fp16")
    assert cfg.common.precision == "fp16" and cfg.common.bf16 is False
    assert notices(capsys) == [
        "shard-hydra-train: notice: common.precision=fp16 wins over common.bf16=true set in the config "
        f"{tmp_path}/bf16.yaml, which is ignored (common.bf16=false)"]


def test_an_fp16_override_wins_over_the_files_precision_by_name(tmp_path, capsys):
    (tmp_path / "named.yaml").write_text("defaults:\n  - shardtrain\n  - _self_\ntask:\n  data: d\n"
                                         "common:\n  precision: bf16\n")
    cfg = hydra_config("--config-dir", str(tmp_path), "--config-name", "named", "common.fp16=true")
    assert cfg.common.fp16 is True and cfg.common.precision is None
    assert notices(capsys) == [
        "shard-hydra-train: notice: common.fp16=true wins over common.precision=bf16 set in the config "
        f"{tmp_path}/named.yaml, which is ignored (common.precision=null)"]
    hydra_config("--config-dir", str(tmp_path), "--config-name", "named", "common.bf16=true")  # the same: no notice
    assert notices(capsys) == []
    with pytest.raises(ConfigError, match=r"^--precision bf16 and --fp16 both pick the precision"):
        hydra_config("--config-dir", str(tmp_path), "--config-name", "named", "common.fp16=true",
                     "common.precision=bf16")  # both on the command line: refused, as from one file


def test_a_value_is_shown_as_an_override_writes_it():
    """Booleans and None as Hydra spells them; anything else as it is: a plugin's precision may be named
    "MyFP8", and the notice must name what the file said."""
    assert [override_wins._shown(v) for v in (True, False, None, 100, "MyFP8")] == ["true", "false", "null", "100",
                                                                                      "MyFP8"]
