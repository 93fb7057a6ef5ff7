"""shard-hydra-train: Hydra configs over the same dataclasses as shard-train's flags."""
import logging
import os
import re
import subprocess
import sys
import uuid

import pytest
from omegaconf import OmegaConf

from shardtrain.cli import hydra_train, train
from shardtrain.config import hydra_files, hydra_keys, hydra_store
from shardtrain.config.run_config import from_dict, parse_train_args, to_dict
from shardtrain.core.errors import ConfigError
from st_testutils import json_records, last_checkpoint_state, make_space_data_bin, tiny_model_flags

EXAMPLES = hydra_files.RECIPES_DIR  # the example configs, shipped in the package
TOY_PLUGIN = os.path.join(os.path.dirname(__file__), "..", "core", "toy_plugin")
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| INFO \| \S+ \| ")  # shardtrain's format


def hydra_config(*argv):
    return hydra_train.build_config(hydra_train.parse_command_line(list(argv)))


def write(path, text):
    path.write_text(text)
    return str(path.parent)


# The same runs as flags and as Hydra overrides; several non-default values in
# every section, and component-specific ones (model, optimizer, scheduler, criterion).
SAME_RUNS = {
    "gpt3 preset, fully_sharded": (
        ["--arch", "transformer_lm_gpt3_small", "--decoder-layers", "3", "--adam-betas", "(0.9, 0.95)",
         "--no-adamw-mode", "--warmup-updates", "123", "--ddp-backend", "fully_sharded",
         "--fsdp-sharding-strategy", "shard_grad_op", "--distributed-world-size", "2", "--cpu", "--lr", "0.0007",
         "--max-update", "10", "--batch-size", "4", "--log-format", "json", "--save-dir", "ck", "--seed", "3"],
        ["model=transformer_lm_gpt3_small", "model.decoder_layers=3", "optimizer.adam_betas=[0.9,0.95]",
         "optimizer.adamw_mode=false", "lr_scheduler.warmup_updates=123", "distributed.ddp_backend=fully_sharded",
         "distributed.fsdp_sharding_strategy=shard_grad_op", "distributed.distributed_world_size=2",
         "common.cpu=true", "optimization.lr=0.0007", "optimization.max_update=10", "dataset.batch_size=4",
         "common.log_format=json", "checkpoint.save_dir=ck", "common.seed=3"]),
    "other components": (
        ["--optimizer", "adafactor", "--lr-scheduler", "cosine", "--criterion", "label_smoothed_cross_entropy",
         "--label-smoothing", "0.1", "--tokens-per-sample", "64", "--decoder-embed-dim", "96",
         "--bucket-cap-mb", "50", "--zero-sharding", "os", "--update-freq", "2", "--keep-last-epochs", "3"],
        ["optimizer=adafactor", "lr_scheduler=cosine", "criterion=label_smoothed_cross_entropy",
         "criterion.label_smoothing=0.1", "task.tokens_per_sample=64", "model.decoder_embed_dim=96",
         "distributed.bucket_cap_mb=50", "distributed.zero_sharding=os", "optimization.update_freq=2",
         "checkpoint.keep_last_epochs=3"]),
}


@pytest.mark.parametrize("name", sorted(SAME_RUNS))
def test_flags_and_overrides_resolve_to_the_same_config(name, tmp_path):
    flags, overrides = SAME_RUNS[name]
    data = str(tmp_path / "bin")
    expected = to_dict(parse_train_args([data, *flags]))
    assert to_dict(hydra_config(f"task.data={data}", *overrides)) == expected
    defaults = to_dict(parse_train_args([data]))
    changed = {(s, k) for s in expected for k in (expected[s] or {}) if expected[s][k] != (defaults[s] or {}).get(k)}
    assert len(changed) >= len(overrides) - 1  # the runs really differ from the defaults (-1: the arch's name)


def test_a_config_file_with_overrides_equals_the_flags(tmp_path):
    config_dir = write(tmp_path / "run.yaml", """
defaults:
  - shardtrain
  - override model: transformer_lm_gpt
  - override lr_scheduler: polynomial_decay
  - _self_
task:
  data: /data/bin
  tokens_per_sample: 128
model:
  decoder_layers: 4
optimizer:
  adam_betas: [0.8, 0.9]
lr_scheduler:
  warmup_updates: 7
  total_num_update: ${optimization.max_update}
optimization:
  max_update: 300
distributed:
  heartbeat_timeout: 60
""")
    flags = ["/data/bin", "--arch", "transformer_lm_gpt", "--lr-scheduler", "polynomial_decay",
             "--tokens-per-sample", "128", "--decoder-layers", "5", "--adam-betas", "0.8,0.9", "--warmup-updates",
             "7", "--total-num-update", "300", "--max-update", "300", "--heartbeat-timeout", "60",
             "--distributed-world-size", "1"]
    got = hydra_config("--config-dir", config_dir, "--config-name", "run", "model.decoder_layers=5",
                       "distributed.distributed_world_size=1")
    assert to_dict(got) == to_dict(parse_train_args(flags))


def test_groups_list_every_registered_name_and_model_gives_the_preset(tmp_path):
    from hydra.core.config_store import ConfigStore

    from shardtrain.models import ARCH_REGISTRY
    from shardtrain.optim import LR_SCHEDULER_REGISTRY, OPTIMIZER_REGISTRY
    from shardtrain.tasks import CRITERION_REGISTRY, TASK_REGISTRY

    cfg = hydra_config(f"task.data={tmp_path}", "model=transformer_lm_gpt3_small")
    # GPT-3 small (Brown et al. 2020, table 2.1): 12 layers, d_model 768, 12 heads
    assert (cfg.model.decoder_layers, cfg.model.decoder_embed_dim, cfg.model.decoder_attention_heads) == (12, 768, 12)
    assert cfg.components.arch == "transformer_lm_gpt3_small"
    store = ConfigStore.instance()
    for group, registry in [("task", TASK_REGISTRY), ("model", ARCH_REGISTRY), ("criterion", CRITERION_REGISTRY),
                            ("optimizer", OPTIMIZER_REGISTRY), ("lr_scheduler", LR_SCHEDULER_REGISTRY)]:
        assert {n[:-len(".yaml")] for n in store.list(group)} >= set(registry.names()), group
    assert "transformer_lm_gpt3_small.yaml" in store.list("model") and "adafactor.yaml" in store.list("optimizer")


def make_plugin(tmp_path):
    """A fresh --user-dir package (unique names: registries are per process) with one architecture."""
    name = f"hydra_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text(
        "from shardtrain.models import register_model_architecture\n"
        f"@register_model_architecture('transformer_lm', '{name}_arch')\n"
        "def tiny():\n    return {'decoder_layers': 1, 'decoder_embed_dim': 40}\n")
    return str(tmp_path / name), f"{name}_arch"


@pytest.mark.parametrize("where", ["config file", "override", "--user-dir"])
def test_user_dir_plugins_are_imported_before_the_groups_are_built(where, tmp_path):
    plugin, arch = make_plugin(tmp_path)
    if where == "config file":  # pre-scanned from the primary config, which also picks the plugin's arch
        config_dir = write(tmp_path / "plug.yaml", f"defaults:\n  - shardtrain\n  - override model: {arch}\n"
                                                   f"  - _self_\ncommon:\n  user_dir: {plugin}\n")
        cfg = hydra_config("--config-dir", config_dir, "--config-name", "plug", f"task.data={tmp_path}")
    elif where == "override":
        cfg = hydra_config(f"common.user_dir={plugin}", f"model={arch}", f"task.data={tmp_path}")
    else:
        cfg = hydra_config("--user-dir", plugin, f"model={arch}", f"task.data={tmp_path}")
    assert (cfg.components.arch, cfg.model.decoder_layers, cfg.model.decoder_embed_dim) == (arch, 1, 40)
    assert cfg.common.user_dir == plugin
    assert to_dict(cfg) == to_dict(parse_train_args([str(tmp_path), "--user-dir", plugin, "--arch", arch]))


def test_toy_plugin_task_and_model_fields(tmp_path):
    flags = [str(tmp_path), "--user-dir", TOY_PLUGIN, "--task", "toy_lm", "--toy-greeting", "bonjour",
             "--arch", "toy_bigram_wide", "--toy-layers", "3"]
    cfg = hydra_config(f"task.data={tmp_path}", "--user-dir", TOY_PLUGIN, "task=toy_lm", "task.toy_greeting=bonjour",
                       "model=toy_bigram_wide", "model.toy_layers=3")
    assert (cfg.model.toy_dim, cfg.model.toy_layers, cfg.task.toy_greeting) == (48, 3, "bonjour")
    assert to_dict(cfg) == to_dict(parse_train_args(flags))


BAD = {
    "unknown section key": (["optimization.lrr=0.1"],
                            ["'optimization.lrr'", "Did you mean 'optimization.lr'?", "max_update, stop_time_hours"]),
    "unknown key added with +": (["+optimization.lrr=0.1"], ["'optimization.lrr'", "Did you mean 'optimization.lr'"]),
    "unknown component key": (["model.decoder_layerz=3"], ["'model.decoder_layerz'", "'model.decoder_layers'",
                                                            "Keys of model (transformer_lm)"]),
    "unknown top-level key": (["optimisation.lr=0.1"], ["'optimisation'", "Did you mean 'optimization'"]),
    "components section": (["components.arch=x"], ["'components'", "model=ARCH"]),
    "unknown group option": (["optimizer=adamm"], ["Unknown optimizer 'adamm'", "Did you mean 'adam'?",
                                                    "adafactor, adagrad, adam, adamax", "--user-dir"]),
    "unknown architecture": (["model=transformer_lm_gpt9"], ["Unknown model architecture", "Did you mean"]),
    "bad value": (["optimization.lr=abc"], ["optimization.lr", "'abc'", "Float"]),
    "sweep": (["optimizer=adam,sgd"], ["sweep", "multirun"]),
    "unresolvable interpolation": (["optimization.lr=${{nope}}"], ["Cannot resolve", "'nope' not found",
                                                                 "optimization.lr"]),
    "missing environment variable": (["checkpoint.save_dir=${{oc.env:SHARDTRAIN_NO_SUCH_VAR}}"],
                                     ["Cannot resolve", "SHARDTRAIN_NO_SUCH_VAR"]),
    "section given a value": (["optimization=adam"], ["'optimization' is a section", "Did you mean optimizer=adam?"]),
    "section set to null": (["common=null"], ["'common' is a section", "common.KEY=VALUE"]),
    "missing data": ([], ["task.data must be set", "task.data=VALUE"]),
    "table check": (["optimization.update_freq=0"], ["optimization.update_freq must be at least 1"]),
    "missing config dir": (["--config-dir", "{tmp}/nope", "--config-name", "x"], ["does not exist", "--config-dir"]),
    "missing config name": (["--config-dir", "{tmp}", "--config-name", "rnu"], ["no {tmp}/rnu.yaml",
                                                                                 "Did you mean 'run'?"]),
    "file: unknown key": (["--config-dir", "{tmp}", "--config-name", "badkey"],
                          ["'optimization.lrr'", "badkey.yaml", "Did you mean 'optimization.lr'?"]),
    "file: unknown component key": (["--config-dir", "{tmp}", "--config-name", "badmodel"],
                                    ["'model.decoder_layerz'", "badmodel.yaml",
                                     "Did you mean 'model.decoder_layers'?"]),
    "file: unknown option": (["--config-dir", "{tmp}", "--config-name", "badopt"],
                             ["Unknown optimizer 'adamm'", "badopt.yaml", "Did you mean 'adam'?"]),
    "file: not extending the base": (["--config-dir", "{tmp}", "--config-name", "nobase"],
                                     ["nobase.yaml", "- shardtrain"]),
    "file: top-level junk": (["--config-dir", "{tmp}", "--config-name", "junk"], ["'colour'", "junk.yaml"]),
    # every field with choices is checked whichever front end set it (red-team item 6 of issue 16)
    "choice: sharding strategy": (["distributed.fsdp_sharding_strategy=foo"],
                                  ["'foo' is not a choice of distributed.fsdp_sharding_strategy.",
                                   "Choices: full_shard, shard_grad_op"]),
    "choice: zero sharding": (["distributed.zero_sharding=foo"], ["not a choice of distributed.zero_sharding.", "Choices: none, os"]),
    "choice: backend registry": (["distributed.ddp_backend=fsdp"], ["'fsdp' is not a choice of distributed.ddp_backend.",
                                                                   "fully_sharded"]),
    "choice: process-group backend": (["distributed.distributed_backend=mpi"], ["Choices: nccl, gloo."]),
    "choice: component field": (["model.activation_fn=rellu"], ["not a choice of model.activation_fn. Did you mean 'relu'?"]),
    "file: alias bomb": (["--config-dir", "{tmp}", "--config-name", "bomb"],
                         ["bomb.yaml expands to 11,111,1", "values through its YAML aliases"]),
    # files the defaults list or an override pulls in are bounded too, before any is loaded
    "file: alias bomb in the defaults": (["--config-dir", "{tmp}", "--config-name", "usesbomb"],
                                         ["model/nested/bomb.yaml expands to 11,111,1"]),
    "file: alias bomb by override": (["--config-dir", "{tmp}", "--config-name", "run", "model=bombmodel"],
                                     ["model/bombmodel.yaml expands to 11,111,1"]),
    "file: bad choice": (["--config-dir", "{tmp}", "--config-name", "badchoice"],
                         ["'oss' is not a choice of distributed.zero_sharding", "Did you mean 'os'?"]),
}
FILES = {
    "run": "defaults: [shardtrain, _self_]\n",
    "badkey": "defaults: [shardtrain, _self_]\noptimization:\n  lrr: 1\n",
    "badmodel": "defaults: [shardtrain, _self_]\nmodel:\n  decoder_layerz: 2\n",
    "badopt": "defaults:\n  - shardtrain\n  - override optimizer: adamm\n  - _self_\n",
    "nobase": "optimization:\n  lr: 0.1\n",
    "junk": "defaults: [shardtrain, _self_]\ncolour: blue\n",
    "bomb": "defaults: [shardtrain, _self_]\na: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{k}: &{k} [{','.join(['*' + p] * 10)}]\n" for p, k in zip("abcdef", "bcdefg")),
    "badchoice": "defaults: [shardtrain, _self_]\ndistributed:\n  zero_sharding: oss\n",
    "usesbomb": "defaults:\n  - shardtrain\n  - override model: viabomb\n  - _self_\n",
    "model/viabomb": "defaults:\n  - nested: bomb\n",  # relative to its own group: model/nested/bomb
}
FILES["model/nested/bomb"] = FILES["model/bombmodel"] = FILES["bomb"].replace("defaults: [shardtrain, _self_]\n", "")


@pytest.mark.parametrize("name", sorted(BAD))
def test_mistakes_are_one_paragraph_errors(name, tmp_path, capsys):
    for config, text in FILES.items():
        (tmp_path / f"{config}.yaml").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{config}.yaml").write_text(text)
    argv, expected = BAD[name]
    argv = [a.format(tmp=tmp_path) for a in argv]
    if name != "missing data":
        argv.append(f"task.data={tmp_path}")
    with pytest.raises(SystemExit) as info:
        hydra_train.main(argv + ["--cfg", "job"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith("shard-hydra-train: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for text in expected:
        assert text.format(tmp=tmp_path) in err, (text, err)
    flags = set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", err)) - set(hydra_train.OWN_OPTIONS)
    assert not flags & set(hydra_keys.flag_table()), err  # keys, not shard-train's flags


@pytest.mark.slow
def test_console_script_exits_cleanly(tmp_path):
    result = subprocess.run(["shard-hydra-train", "optimizer=adamm", f"task.data={tmp_path}"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Did you mean 'adam'?" in result.stderr and "Traceback" not in result.stderr
    assert os.listdir(tmp_path) == []  # no outputs/ or .hydra


def test_composing_leaves_logging_and_the_working_directory_alone(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    handlers = list(logging.getLogger().handlers)
    cfg = hydra_train.main([f"task.data={tmp_path}", "--cfg", "job", "optimization.lr=0.25"])
    assert logging.getLogger().handlers == handlers and not logging.getLogger("hydra").handlers
    assert os.getcwd() == str(tmp_path) and os.listdir(tmp_path) == []
    assert OmegaConf.create(capsys.readouterr().out).optimization.lr == [0.25] == cfg.optimization.lr  # a list


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("hydra")), n_words=8, train_tokens=2000,
                               valid_tokens=200, line_len=40, seed=6)


def check_config_yaml(save_dir, cfg=None):
    """config.yaml in the save dir is the run's resolved config, the one in the checkpoint."""
    written = OmegaConf.to_container(OmegaConf.load(os.path.join(save_dir, "config.yaml")))
    assert written == last_checkpoint_state(save_dir)["cfg"]
    assert to_dict(from_dict(written)) == written
    if cfg is not None:
        assert written == to_dict(cfg)
    return written


EXAMPLE_RUNS = {  # pytorch_ddp spawns two gloo ranks, as shard-train would; the others run in this process
    "lm_pytorch_ddp": ["distributed.distributed_world_size=2", "common.cpu=true"],
    "lm_legacy_ddp": [],
    "lm_fully_sharded": [],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLE_RUNS))
def test_example_configs_train(name, data_bin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no --config-dir: the built-in config of that name
    log = str(tmp_path / "log")
    argv = ["--config-name", name, f"task.data={data_bin}", "optimization.max_update=2",
            "lr_scheduler.warmup_updates=1", "dataset.batch_size=4", "task.tokens_per_sample=32",
            "checkpoint.save_dir=ck", "common.log_format=json", "common.log_interval=1", f"common.log_file={log}",
            "common.threads=1", *EXAMPLE_RUNS[name]]
    hydra_train.main(argv)
    assert [r["num_updates"] for r in json_records(log, "train_inner")] == [1, 2]
    with open(log) as f:
        assert all(LOG_LINE.match(line) for line in f if line.startswith("20"))
    written = check_config_yaml("ck", hydra_config(*argv))
    assert written["distributed"]["ddp_backend"] == name[len("lm_"):]
    assert sorted(os.listdir(tmp_path)) == ["ck", "log"]  # no outputs/, .hydra or log file of Hydra's


def test_builtin_config_names_and_their_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert hydra_files.builtin_config_names() == ["lm_fully_sharded", "lm_legacy_ddp", "lm_pytorch_ddp"]
    assert hydra_config("--config-name", "lm_legacy_ddp", "task.data=d").distributed.ddp_backend == "legacy_ddp"
    # A file of the same name in the working directory is the user's and wins over the built-in one.
    (tmp_path / "lm_legacy_ddp.yaml").write_text("defaults:\n  - shardtrain\n  - _self_\noptimization:\n  lr: 0.5\n")
    assert hydra_config("--config-name", "lm_legacy_ddp", "task.data=d").optimization.lr == [0.5]
    # So does an explicit --config-dir: built-in names are not looked up there.
    with pytest.raises(ConfigError, match="built into shardtrain .*lm_fully_sharded, lm_legacy_ddp"):
        hydra_config("--config-dir", str(tmp_path), "--config-name", "lm_fully_sharded")


@pytest.mark.slow
def test_shard_train_writes_config_yaml_too(data_bin, tmp_path):
    save = str(tmp_path / "ck")
    argv = [data_bin, *tiny_model_flags(), "--save-dir", save, "--warmup-updates", "1", "--max-update"]
    train.main(argv + ["1"])
    assert check_config_yaml(save, parse_train_args(argv + ["1"]))["optimization"]["max_update"] == 1
    train.main(argv + ["2"])  # resumed with another --max-update: config.yaml follows
    assert check_config_yaml(save)["optimization"]["max_update"] == 2


def test_an_alias_bomb_is_refused_in_time_linear_in_its_size(tmp_path):
    """10^12 values (and 12 keys) in a few hundred bytes: counted per distinct node, not expanded (issue 16, item 10)."""
    import time

    from shardtrain.config.yaml_bound import check_yaml_files
    from shardtrain.core.errors import ConfigError

    path = tmp_path / "bomb.yaml"
    path.write_text("a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{k}: &{k} [{','.join(['*' + p] * 10)}]\n" for p, k in zip("abcdefghijk", "bcdefghijkl")))
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="expands to 1,111,111,111,122 values"):
        check_yaml_files([str(path)])
    assert time.perf_counter() - start < 1.0
    check_yaml_files([os.path.join(EXAMPLES, name) for name in os.listdir(EXAMPLES) if name.endswith(".yaml")])


def test_every_file_composing_could_load_is_bounded_before_any_is_read(tmp_path):
    """The primary config's defaults (nested groups relative to their file, absolute ones, lists) and the
    GROUP=OPTION overrides name the files checked; a bomb nothing names is left alone (issue 16, item 10)."""
    from shardtrain.config.yaml_bound import check_config_tree
    from shardtrain.core.errors import ConfigError

    bomb = FILES["model/bombmodel"]
    tree = {"main": "defaults:\n  - shardtrain\n  - override model: viabomb\n  - _self_\n",
            "model/viabomb": "defaults:\n  - nested: ok\n  - /optimizer: [x, bombopt]\n",
            "model/nested/ok": "a: 1\n", "optimizer/bombopt": bomb, "unused": bomb, "model/other": bomb}
    for name, text in tree.items():
        (tmp_path / f"{name}.yaml").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{name}.yaml").write_text(text)
    with pytest.raises(ConfigError, match=r"optimizer/bombopt\.yaml expands to"):
        check_config_tree(str(tmp_path), str(tmp_path / "main.yaml"), [])
    (tmp_path / "optimizer/bombopt.yaml").write_text("lr: 1\n")
    check_config_tree(str(tmp_path), str(tmp_path / "main.yaml"), ["optimization.lr=1"])  # unused, other: not read
    with pytest.raises(ConfigError, match=r"model/other\.yaml expands to"):
        check_config_tree(str(tmp_path), None, ["+model=[ok,other]"])
