"""A run that starts from a Hugging Face folder: the model comes from DIR/config.json.

One rule, two front ends: shard-train's ``--finetune-from-model DIR`` (run_config.py) and shard-hydra-train's
``checkpoint.finetune_from_model=DIR`` (hydra_store.py, cli/hydra_train.py). The folder's values become the
model's defaults (as an architecture preset's do), so ``--help``, ``--cfg job`` and the log show them and no
architecture need be chosen; one of another family is refused, and so is a preset whose sizes disagree. A model
setting given with another value than config.json's is refused, naming both; settings config.json does not fix
(dropout, --depth-init, ...) may be given. Messages name flags; shard-hydra-train rewrites them as keys."""
import argparse
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence

from shardtrain.config import components
from shardtrain.core.errors import ConfigError

if TYPE_CHECKING:
    from shardtrain.models.hf_config import HfModelConfig


def folder_config(path: Optional[str]) -> Optional["HfModelConfig"]:
    """``path``'s config.json when ``path`` is a Hugging Face folder; None for a checkpoint, or no path."""
    if path is None:  # most runs: nothing imported (shardtrain.models imports torch)
        return None
    from shardtrain.models.hf_config import is_hf_folder, read_folder_config
    return read_folder_config(path) if is_hf_folder(path) else None


def family_of(arch: str) -> str:
    """The registered model an architecture builds."""
    return components.registries()["model"][1].get(arch).obj.model


def check_arch(hf: "HfModelConfig", arch: str, folder: str, where: str) -> None:
    """An architecture chosen (``where``) for a run from ``folder``: of the folder's family, and a preset that
    agrees with config.json wherever both set a value."""
    chosen = family_of(arch)
    if chosen != hf.model:
        raise ConfigError(f"--arch {arch} ({where}) builds a {chosen} model, but the folder {folder} "
                          f"(--finetune-from-model) holds a {hf.raw.get('model_type')} model (shardtrain's "
                          f"{hf.model} family). Leave --arch out, or give --arch {hf.model}: the folder's "
                          "config.json sets the model.")
    preset = components.registries()["model"][1].get(arch).obj.values()
    _refuse_disagreement(hf, preset, lambda key: f"--arch {arch}'s preset",
                         f"leave --arch out, or give --arch {hf.model} (config.json sets the sizes)")


def model_preset(hf: "HfModelConfig", preset: Dict) -> Dict:
    """The model's defaults: an architecture preset's other fields, then the folder's."""
    return {**(preset or {}), **hf.values}


def check_model_agrees(hf: "HfModelConfig", values: Dict, where: Callable[[str], str]) -> None:
    """The model's config ``values`` (built over ``model_preset``, so a value that differs from config.json's was
    set by the user, in the place ``where(field)`` names)."""
    _refuse_disagreement(hf, values, where, "leave those settings out (config.json sets them), or start from "
                                            "another folder")


def _refuse_disagreement(hf: "HfModelConfig", values: Dict, where: Callable[[str], str], fix: str) -> None:
    differ = [f"--{key.replace('_', '-')} {values[key]} (from {where(key)}) but config.json's {hf.sources[key]} "
              f"gives {hf.values[key]}" for key in hf.values if key in values and values[key] != hf.values[key]]
    if differ:
        raise ConfigError(f"The model's settings contradict the Hugging Face folder's config.json: "
                          f"{'; '.join(differ)}. Its weights have the folder's shapes and positions: {fix}.")


# shard-train's front end: the folder and --arch read from the command line before the parser is built.

def apply_folder(argv: Sequence[str], pre) -> Optional["HfModelConfig"]:
    """Read the folder's config.json (None when the run does not start from one); set ``pre.arch`` to the
    folder's family when --arch is not given, else check the one given."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--finetune-from-model", default=None)
    folder = parser.parse_known_args(list(argv))[0].finetune_from_model
    hf = folder_config(folder)
    if hf is None:
        return None
    if any(a == "--arch" or a.startswith("--arch=") for a in argv):
        check_arch(hf, pre.arch, folder, "on the command line")
    else:
        pre.arch = hf.model
    return hf


def check_flags_agree(cfg, hf: Optional["HfModelConfig"]) -> None:
    """After parsing: a model flag whose value differs from config.json's was given on the command line."""
    if hf is not None:
        check_model_agrees(hf, dict(cfg.model), lambda key: "the command line")
