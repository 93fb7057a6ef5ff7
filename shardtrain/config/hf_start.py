"""``--finetune-from-model DIR`` where DIR is a Hugging Face folder: the model comes from DIR/config.json.

The folder's values become the model's defaults (as an --arch preset's do), so ``--help`` and the log show
them and ``--arch`` is optional. A model flag given with another value than config.json's is refused, naming
both; flags config.json does not fix (dropout, --depth-init, ...) may be set."""
import argparse
from typing import TYPE_CHECKING, Dict, Optional, Sequence

from shardtrain.config import components
from shardtrain.core.errors import ConfigError

if TYPE_CHECKING:
    from shardtrain.models.hf_config import HfModelConfig


def folder_of(argv: Sequence[str]) -> Optional[str]:
    """The --finetune-from-model argument when it is a Hugging Face folder."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--finetune-from-model", default=None)
    known, _ = parser.parse_known_args(list(argv))
    if known.finetune_from_model is None:  # most runs: nothing imported (shardtrain.models imports torch)
        return None
    from shardtrain.models.hf_config import is_hf_folder
    return known.finetune_from_model if is_hf_folder(known.finetune_from_model) else None


def _arch_given(argv: Sequence[str]) -> bool:
    return any(a == "--arch" or a.startswith("--arch=") for a in argv)


def apply_folder(argv: Sequence[str], pre) -> Optional["HfModelConfig"]:
    """Read the folder's config.json (None when the run does not start from one); set ``pre.arch`` to the
    folder's family when --arch is not given, and refuse an --arch that is another model or a preset that
    disagrees."""
    folder = folder_of(argv)
    if folder is None:
        return None
    from shardtrain.models.hf_config import read_folder_config
    hf = read_folder_config(folder)
    if not _arch_given(argv):
        pre.arch = hf.model
        return hf
    info = components.resolve(pre)["model"]
    chosen = components.registries()["model"][1].get(pre.arch).obj.model
    if chosen != hf.model:
        raise ConfigError(f"--arch {pre.arch} builds a {chosen} model, but --finetune-from-model {folder} holds a "
                          f"{hf.raw.get('model_type')} model (shardtrain's {hf.model} family). Drop --arch: the "
                          "folder's config.json sets the model.")
    _refuse_disagreement(hf, info.preset, f"--arch {pre.arch}'s preset")
    return hf


def model_preset(hf: "HfModelConfig", preset: Dict) -> Dict:
    """The model slot's defaults: an --arch preset's other fields, then the folder's."""
    return {**(preset or {}), **hf.values}


def check_flags_agree(cfg, hf: Optional["HfModelConfig"]) -> None:
    """After parsing: a model flag whose value differs from config.json's was given on the command line."""
    if hf is not None:
        _refuse_disagreement(hf, dict(cfg.model), "the command line")


def _refuse_disagreement(hf: "HfModelConfig", values: Dict, where: str) -> None:
    differ = [f"--{key.replace('_', '-')} {values[key]} (from {where}) but config.json's {hf.sources[key]} "
              f"gives {hf.values[key]}" for key in hf.values if key in values and values[key] != hf.values[key]]
    if differ:
        raise ConfigError(f"The model flags contradict the Hugging Face folder's config.json: {'; '.join(differ)}. "
                          "Its weights have the folder's shapes and positions: drop those flags (config.json "
                          "sets them), or start from another folder.")
