"""Switching a component of a Hydra recipe from the command line (issue 31, item 2): the keys of the old choice
go with it, the recipe's value of a key the new choice has too stays."""
import os

import pytest
import torch

from shardtrain.cli import hydra_train
from shardtrain.trainer.build import build_lr_scheduler, build_optimizer
from shardtrain.trainer.parallel.choose import backend_class
from shardtrain.trainer.resolved import Components
from st_testutils import cli_refusal, json_records, last_checkpoint_state, make_space_data_bin

TOY_PLUGIN_DIR = os.path.join(os.path.dirname(__file__), "..", "core", "toy_plugin")


def resolved(*overrides, config="lm_fully_sharded"):
    return hydra_train.build_config(hydra_train.parse_command_line(["--config-name", config, "task.data=d",
                                                                    *overrides]))


def built(cfg):
    """The optimizer and lr scheduler the run builds from ``cfg`` (one parameter on the CPU)."""
    components = Components.of(cfg)
    optimizer = build_optimizer(cfg, components, [torch.nn.Parameter(torch.ones(4, 4))], torch.device("cpu"))
    return optimizer, build_lr_scheduler(cfg, components, optimizer)


def test_optimizer_switch_drops_the_old_optimizers_keys_and_keeps_the_shared_ones(capsys):
    cfg = resolved("optimizer=adafactor")
    optimizer, _ = built(cfg)
    assert type(optimizer).__name__ == "Adafactor" and cfg.components.optimizer == "adafactor"
    assert "adam_betas" not in cfg.optimizer
    assert optimizer.param_groups[0]["weight_decay"] == 0.01  # the recipe's (adafactor's default is 0.0)
    assert cfg.optimizer.weight_decay == 0.01 and cfg.optimizer.decay_rate == -0.8
    err = " ".join(capsys.readouterr().err.split())
    assert ("notice: optimizer=adafactor replaces the config's adam: optimizer.adam_betas (adam's, which adafactor "
            "lacks) went with it; kept: optimizer.weight_decay") in err
    cfg = resolved("optimizer=sgd", "optimizer.momentum=0.5")
    optimizer, _ = built(cfg)
    assert type(optimizer) is torch.optim.SGD and optimizer.param_groups[0]["momentum"] == 0.5
    assert optimizer.param_groups[0]["weight_decay"] == 0.01


def test_scheduler_switch_and_the_recipes_own_choice_unchanged():
    cfg = resolved("lr_scheduler=cosine")
    _, scheduler = built(cfg)
    assert type(scheduler).__name__ == "CosineLRSchedule"
    assert "total_num_update" not in cfg.lr_scheduler and cfg.lr_scheduler.warmup_updates == 50
    cfg = resolved()  # no switch: the recipe's polynomial_decay with its own keys
    optimizer, scheduler = built(cfg)
    assert cfg.lr_scheduler.total_num_update == 500 and tuple(optimizer.param_groups[0]["betas"]) == (0.9, 0.95)
    assert type(scheduler).__name__ == "PolynomialDecayLRSchedule"


@pytest.mark.parametrize("config,backend", [("lm_fully_sharded", "legacy_ddp"), ("lm_pytorch_ddp", "fully_sharded"),
                                            ("lm_legacy_ddp", "pytorch_ddp")])
def test_backend_switch(config, backend):
    cfg = resolved(f"distributed.ddp_backend={backend}", config=config)
    assert cfg.distributed.ddp_backend == backend
    assert backend_class(cfg.distributed.ddp_backend).shards_parameters == (backend == "fully_sharded")
    assert cfg.optimizer.adam_betas is not None  # the rest of the recipe is untouched


def test_model_switch_keeps_the_recipes_shape_over_the_new_preset():
    cfg = resolved("model=transformer_lm")
    assert cfg.components.arch == "transformer_lm" and cfg.model.decoder_layers == 2  # the recipe's
    assert cfg.model.activation_fn == "relu"  # transformer_lm's preset; the recipe's own gpt3 one has gelu
    assert resolved().model.activation_fn == "gelu"


def test_task_switch_with_a_plugin(tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - shardtrain\n  - _self_\ntask:\n  data: d\n"
                                        "  tokens_per_sample: 48\n  add_bos_token: true\n")
    argv = ["--config-dir", str(tmp_path), "--config-name", "mine", "--user-dir", TOY_PLUGIN_DIR, "task=toy_lm",
            "task.toy_greeting=hi"]
    cfg = hydra_train.build_config(hydra_train.parse_command_line(argv))
    assert cfg.components.task == "toy_lm" and cfg.task.toy_greeting == "hi" and cfg.task.tokens_per_sample == 48


def test_delete_override_gives_back_the_default_and_a_typo_is_still_named(capsys):
    cfg = resolved("~optimizer.adam_betas")
    assert tuple(cfg.optimizer.adam_betas) == (0.9, 0.999) and cfg.optimizer.weight_decay == 0.01
    cfg = resolved("optimizer=adafactor", "~optimizer.adam_betas")  # what the issue tried: accepted too
    assert cfg.components.optimizer == "adafactor" and "adam_betas" not in cfg.optimizer
    capsys.readouterr()
    _, err = cli_refusal(hydra_train.main, ["--config-name", "lm_fully_sharded", "task.data=d", "~optimizer.adam_betaz",
                                         "--cfg", "job"], capsys)
    assert "Unknown config key 'optimizer.adam_betaz'" in err and "Did you mean 'optimizer.adam_betas'?" in err
    _, err = cli_refusal(hydra_train.main, ["--config-name", "lm_fully_sharded", "task.data=d", "optimizer=adafactor",
                                         "optimizer.adam_betas=[0.9,0.9]", "--cfg", "job"], capsys)
    assert "Unknown config key 'optimizer.adam_betas'" in err and "Keys of optimizer (adafactor)" in err


def test_a_recipes_own_typo_is_not_dropped_by_a_switch(tmp_path, capsys):
    (tmp_path / "typo.yaml").write_text("defaults:\n  - shardtrain\n  - _self_\ntask:\n  data: d\n"
                                        "optimizer:\n  adam_betaz: [0.9, 0.9]\n")
    _, err = cli_refusal(hydra_train.main, ["--config-dir", str(tmp_path), "--config-name", "typo", "optimizer=sgd",
                                         "--cfg", "job"], capsys)
    assert "Unknown config key 'optimizer.adam_betaz'" in err


@pytest.mark.slow
def test_a_switched_recipe_trains(tmp_path, monkeypatch):
    data = make_space_data_bin(str(tmp_path), n_words=8, train_tokens=1500, valid_tokens=200, line_len=40, seed=3)
    monkeypatch.chdir(tmp_path)
    log = str(tmp_path / "log")
    hydra_train.main(["--config-name", "lm_fully_sharded", f"task.data={data}", "optimizer=adafactor",
                      "lr_scheduler=cosine", "distributed.ddp_backend=legacy_ddp", "optimization.max_update=2",
                      "lr_scheduler.warmup_updates=1", "dataset.batch_size=4", "task.tokens_per_sample=32",
                      "checkpoint.save_dir=ck", "common.log_format=json", "common.log_interval=1",
                      f"common.log_file={log}", "common.threads=1"])
    assert [r["num_updates"] for r in json_records(log, "train_inner")] == [1, 2]
    cfg = last_checkpoint_state("ck")["cfg"]
    assert cfg["components"]["optimizer"] == "adafactor" and cfg["components"]["lr_scheduler"] == "cosine"
    assert cfg["distributed"]["ddp_backend"] == "legacy_ddp" and cfg["optimizer"]["weight_decay"] == 0.01
