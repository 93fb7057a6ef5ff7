"""Build the typed run config: from command-line flags, or from a saved dict."""
from typing import Dict, List, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from shardtrain.core import plugins
from shardtrain.config import components, epoch_lists, fairseq_compat, flags, hf_start
from shardtrain.config.checks import check_config
from shardtrain.config.sections import SECTIONS, ComponentsConfig, ShardtrainConfig
from shardtrain.core.errors import ConfigError
from shardtrain.core.user_dir import import_user_dir, with_user_dir_imported

_TITLES = {
    "components": "components", "common": "common", "dataset": "dataset and batching",
    "optimization": "optimization", "checkpoint": "checkpointing", "distributed": "distributed training",
    "task": "task ({})",
    "model": "model ({})", "criterion": "criterion ({})", "optimizer": "optimizer ({})",
    "lr_scheduler": "lr scheduler ({})",
}

_TRAIN_DESCRIPTION = """Train a model.

The flags of the selected --task, --arch, --criterion, --optimizer and
--lr-scheduler are listed in their own groups below. Components come from
shardtrain, from installed plugins (entry-point group "shardtrain.plugins")
and from --user-dir."""


def build_train_parser(argv: Sequence[str], prog: str = "shard-train"):
    """Stage two of parsing: every section plus the selected components' flags."""
    parser, slots, _, _ = _train_parser(argv, prog)
    return parser, slots


def _train_parser(argv: Sequence[str], prog: str):
    """(parser, the selected components' config classes, the pre-parsed component names, the Hugging Face
    folder's config the run starts from or None)."""
    plugins.load_plugins()  # installed plugins may provide the --task/--arch/... named below
    pre = flags.preparse(argv, ComponentsConfig())
    import_user_dir(pre.user_dir)
    hf = hf_start.apply_folder(argv, pre)  # --finetune-from-model DIR/config.json: the model's defaults
    slots = components.slot_config_classes(pre)
    if hf is not None:
        slots["model"] = (slots["model"][0], hf_start.model_preset(hf, slots["model"][1]))
    sections = [(name, cls, {"arch": pre.arch} if hf is not None and name == "components" else None)
                for name, cls in SECTIONS.items()]
    for slot, (cls, preset) in slots.items():
        if cls is not None:
            sections.append((slot, cls, preset))
    parser = flags.new_parser(prog, _TRAIN_DESCRIPTION, usage=flags.short_usage(prog, sections))
    titles = {s: t.format(getattr(pre, "arch" if s == "model" else s, "")) for s, t in _TITLES.items()}
    flags.add_sections(parser, sections, titles)
    fairseq_compat.add_table_flags(parser, fairseq_compat.selected_owners(pre))
    return parser, slots, pre, hf


def parse_train_args(argv: Sequence[str], prog: str = "shard-train") -> DictConfig:
    return parse_train_command(argv, prog)[0]


def parse_train_command(argv: Sequence[str], prog: str = "shard-train") -> Tuple[DictConfig, List[str]]:
    """The run's config, and the notices for the fairseq flags it accepted and ignores."""
    parser, slots, pre, hf = _train_parser(argv, prog)
    namespace, rest = parser.parse_known_args(list(argv))
    if rest:
        unselected = fairseq_compat.explain_unknown(rest, pre)
        if unselected:
            parser.error(unselected)  # argparse's usage and exit 2, as for any unrecognized flag
        parser.parse_args(list(argv))  # argparse's own "unrecognized arguments" (exits 2)
    uses = fairseq_compat.given(namespace)
    fairseq_compat.check_refused(uses)
    values = {name: flags.section_values(namespace, name) for name in SECTIONS}
    for slot, (cls, _) in slots.items():
        values[slot] = flags.section_values(namespace, slot) if cls is not None else None
    cfg = from_dict(values)
    hf_start.check_flags_agree(cfg, hf)
    check_config(cfg)
    return cfg, fairseq_compat.notices(uses)


def from_dict(values: Dict) -> DictConfig:
    """Typed config from plain values (flags, a checkpoint, a Hydra config).

    Unknown keys are errors: a saved config that names a field this version
    does not know must not be silently dropped.
    """
    # Every command builds its config here (shard-validate/-generate from a
    # checkpoint's), so a checkpoint of a plugin's model finds its components.
    plugins.load_plugins()
    values = with_user_dir_imported(values)  # the run's --user-dir plugin, likewise (its absolute path kept)
    names = ComponentsConfig(**(values.get("components") or {}))
    cfg = OmegaConf.structured(ShardtrainConfig(components=names))
    try:
        for section in SECTIONS:
            if values.get(section):
                cfg[section] = OmegaConf.merge(cfg[section], values[section])
        epoch_lists.normalize(cfg.optimization)
        for slot, (cls, preset) in components.slot_config_classes(names).items():
            if cls is None:
                continue
            if slot == "model":
                components.check_preset(names.arch, cls, preset)
            node = OmegaConf.merge(OmegaConf.structured(cls), preset, values.get(slot) or {})
            cfg[slot] = node
    except OmegaConfBaseException as e:
        raise ConfigError(f"Invalid config value: {' '.join(str(e).split())}. Check the flag or config key "
                          "named above.") from None
    return cfg


def to_dict(cfg: DictConfig) -> Dict:
    """Plain dict (for checkpoints and logs)."""
    return OmegaConf.to_container(cfg, resolve=True)
