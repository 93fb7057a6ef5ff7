"""``shard-hydra-train [--config-dir DIR] [--config-name NAME] [key=value ...]``: shard-train from Hydra configs.

The same dataclasses, typed config, checks and training entry as shard-train;
only how the values are written differs (examples/configs/README.md). The example configs are
built in (shardtrain/config/recipes/): ``--config-name lm_fully_sharded`` finds them from any directory.

Hydra's compose API (``initialize_config_dir`` + ``compose``), not
``@hydra.main``: compose builds the config and does nothing else, so Hydra makes
no outputs/ or .hydra directory, writes no log file, installs no logging
handlers and keeps the working directory, with no hydra.* settings to get
right; and its errors come back as exceptions we turn into our one-paragraph
messages instead of Hydra printing its own and exiting. What @hydra.main would
add (multirun sweeps, shell completion) shard-train does not offer either.
"""
import argparse
import os
import re
from typing import List, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from shardtrain.core import plugins
from shardtrain.cli import train
from shardtrain.cli.errors import cli_entry
from shardtrain.config import hf_start, hydra_files, hydra_keys, hydra_store
from shardtrain.config.run_config import from_dict, import_user_dir
from shardtrain.config.checks import check_config
from shardtrain.config.fairseq_compat import print_notices
from shardtrain.config.yaml_bound import check_config_tree
from shardtrain.config.flags import new_parser
from shardtrain.config.sections import COMPONENT_SLOTS
from shardtrain.core.errors import ConfigError
from shardtrain.trainer import preflight
from shardtrain.trainer.launch import start

PROG = "shard-hydra-train"
DESCRIPTION = f"""Train a model from a Hydra config: shard-train's options as YAML and key=value overrides.

  {PROG} --config-name lm_pytorch_ddp task.data=DATA_BIN \\
      optimization.max_update=100 model=transformer_lm_gpt3_small optimizer.adam_betas=[0.9,0.95]

Keys are shard-train's flags with '_' for '-' under their section (common, dataset,
optimization, checkpoint, distributed) or component (task, model, criterion, optimizer,
lr_scheduler); the components are config groups with one option per registered name
(model: per architecture, with its preset). Choosing another one on the command line
(optimizer=adafactor on a config written for adam) drops the file's keys that only
the old one has and keeps the others; ~KEY gives a key its default back. A config
file extends the base config:

  defaults:
    - shardtrain
    - override model: transformer_lm_gpt
    - _self_

Print the resolved config with --cfg job."""


OWN_OPTIONS = ("--config-dir", "--config-name", "--user-dir", "--cfg")


def parse_command_line(argv: List[str]) -> argparse.Namespace:
    parser = new_parser(PROG, DESCRIPTION)
    parser.add_argument("--config-dir", "-cd", default=None,
                        help="directory of the YAML configs (default: the working directory, then the configs built "
                             "into shardtrain)")
    parser.add_argument("--config-name", "-cn", default=None,
                        help="primary config, a file CONFIG_NAME.yaml in --config-dir, or one of the configs built into "
                             f"shardtrain: {', '.join(hydra_files.builtin_config_names())} (default: shardtrain's "
                             "base config, so everything comes from overrides)")
    parser.add_argument("--user-dir", default=None,
                        help="plugin package to import before the config groups are built (the same as the "
                             "override common.user_dir=PATH)")
    parser.add_argument("--cfg", choices=["job"], default=None,
                        help="print the resolved config as YAML and exit without training")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="Hydra overrides, e.g. optimization.lr=0.001 model=transformer_lm_gpt")
    return parser.parse_intermixed_args(argv)  # overrides may come before and after the options


def build_config(args: argparse.Namespace) -> DictConfig:
    """The typed run config, exactly as ``parse_train_args`` builds it from flags."""
    config_dir = hydra_files.config_dir_for(args.config_dir, args.config_name)
    if args.config_name:
        path = hydra_files.config_path(config_dir, args.config_name)
        name, source = os.path.basename(path)[:-len(".yaml")], f"the config {path}"
    else:
        path, name, source = None, hydra_files.BASE_CONFIG, "shardtrain's base config"
        hydra_files.check_config_dir(config_dir)
    hydra_files.check_base_not_hidden(config_dir)
    overrides = list(args.overrides) + ([f"common.user_dir={quote(args.user_dir)}"] if args.user_dir else [])
    check_config_tree(config_dir, path, overrides)  # alias bombs, before anything loads a file
    composed, choices, notes, hf = _compose(config_dir, name, path, overrides, source)
    print_notices([f"notice: {note}" for note in notes], PROG)
    try:
        values = {key: OmegaConf.to_container(composed[key], resolve=True)
                  for key in hydra_store.FRAMEWORK_SECTIONS + hydra_store.GROUPS}
    except OmegaConfBaseException as e:
        raise ConfigError(f"Cannot resolve {source}: {' '.join(str(e).split())}. Fix the interpolation "
                          "(${...}) named above.") from None
    values["components"] = {COMPONENT_SLOTS[group]: choices[group] for group in hydra_store.GROUPS}
    if hf is not None:
        hf_start.check_arch(hf, choices["model"], values["checkpoint"]["finetune_from_model"],
                            _chosen_where(overrides, "model", source))
    cfg = from_dict(values)
    if hf is not None:
        hf_start.check_model_agrees(hf, dict(cfg.model), lambda key: _chosen_where(overrides, f"model.{key}",
                                                                                    source))
    check_config(cfg)
    return cfg


PRESCANNED = ("common.user_dir", "checkpoint.finetune_from_model")  # needed before the store is filled


def _compose(config_dir: str, name: str, path: Optional[str], overrides: List[str], source: str):
    """(composed config, group choices, notes, the Hugging Face folder's config the run starts from or None).
    The plugin (common.user_dir) is imported and the folder read before composing; a value set where the
    pre-scan does not look (a file the defaults list adds) composes again."""
    user_dir, folder = (prescan(path, overrides, key) for key in PRESCANNED)
    plugins.load_plugins()  # installed and --user-dir plugins register before the store lists the registries
    import_user_dir(user_dir)
    hf = hf_start.folder_config(folder)
    composed, choices, notes = hydra_store.compose(config_dir, name, overrides, source, hf)
    composed_user_dir, composed_folder = (OmegaConf.select(composed, key, throw_on_resolution_failure=False)
                                          for key in PRESCANNED)
    if (composed_user_dir, composed_folder) != (user_dir, folder):
        import_user_dir(composed_user_dir)
        hf = hf_start.folder_config(composed_folder)
        composed, choices, notes = hydra_store.compose(config_dir, name, overrides, source, hf)
    return composed, choices, notes, hf


def _chosen_where(overrides: List[str], key: str, source: str) -> str:
    """Where a key's value (or a group's choice) came from, for a message: its override, else the config."""
    lines = [o.input_line for o in hydra_store.parse_overrides(overrides) if o.key_or_group == key]
    return f"the override '{lines[-1]}'" if lines else source


def prescan(config_file: Optional[str], overrides: List[str], key: str) -> Optional[str]:
    """``key`` (``common.user_dir``, ...) before composing: the last override that sets it, else
    the primary config file's value (interpolations resolved where they can be)."""
    for override in reversed(hydra_store.parse_overrides(overrides)):
        if override.key_or_group == key:
            return None if override.is_delete() else override.value()
    if config_file is None:
        return None
    try:
        raw = OmegaConf.load(config_file)
    except Exception as e:  # noqa: BLE001 - YAML and OmegaConf raise many types for a bad file
        raise ConfigError(f"Cannot read {config_file}: {' '.join(str(e).split())}. Fix the YAML syntax.") from None
    if not isinstance(raw, DictConfig):
        return None  # not a mapping: composing reports it
    return OmegaConf.select(raw, key, default=None, throw_on_resolution_failure=False)


def quote(value: str) -> str:
    """A path as one quoted Hydra override value (commas, spaces and '=' included).
    Hydra's rule: escape quotes, and double the backslashes before a quote or at the end."""
    value = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, value) + "'"


def in_keys(message: str) -> str:
    """An error in the words of this command's users: config keys where the message names flags (but not
    the options this command has itself)."""
    return hydra_keys.as_keys(message, keep=OWN_OPTIONS)


@cli_entry(PROG, rewrite=in_keys)
def main(argv):
    args = parse_command_line(argv)
    cfg = build_config(args)
    if args.cfg == "job":
        print(OmegaConf.to_yaml(cfg), end="")
        return cfg
    print_notices(train.cpu_precision_warning(cfg), PROG)
    preflight.check_before_launch(cfg)  # before any rank starts
    from shardtrain.trainer import loop  # DCP and FSDP2 (~2 s) after the checks, as in shard-train
    return start.call_main(cfg, loop.main)


if __name__ == "__main__":
    main()
