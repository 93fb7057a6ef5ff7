"""Which model family reads and writes a Hugging Face folder's ``config.json``, without naming a family's fields
outside its folder: the family's ``hf_config`` module maps the keys (``llama/hf_config.py``).

A folder is recognised by its content: a directory holding ``config.json`` is a Hugging Face folder. Only JSON
is read from it; nothing in it is imported or run (there is no ``trust_remote_code``)."""
import dataclasses
import glob
import json
import os
from typing import Dict, Optional, Tuple

from shardtrain.core.errors import DataError
from shardtrain.models.llama import hf_config as llama_hf, hf_keys as llama_keys

CONFIG = "config.json"
FAMILIES = {"llama": llama_hf}  # our model name -> its config.json mapping
KEYS = {"llama": llama_keys}  # our model name -> its weight names (to_ours, to_hf)
MODEL_TYPES = {model_type: name for name, family in FAMILIES.items() for model_type in family.MODEL_TYPES}


@dataclasses.dataclass(frozen=True)
class HfModelConfig:
    model: str  # our registered model name
    values: Dict  # its config fields, as config.json sets them
    sources: Dict  # field -> the config.json key that set it (for messages)
    vocab_size: int
    raw: Dict  # config.json as read


def is_hf_folder(path: Optional[str]) -> bool:
    """A directory that holds a config.json, or one that holds safetensors weights (so that a folder missing
    its config.json is named as such, not taken for a sharded checkpoint)."""
    if not path or not os.path.isdir(path):
        return False
    return os.path.isfile(os.path.join(path, CONFIG)) or bool(glob.glob(os.path.join(path, "*.safetensors")))


def read_folder_config(folder: str) -> HfModelConfig:
    path = os.path.join(folder, CONFIG)
    if not os.path.isfile(path):
        raise DataError(f"{folder} holds safetensors weights but no {CONFIG}, so the model's sizes are unknown. "
                        f"Copy the {CONFIG} that came with the weights into it (shardtrain reads sizes from it and "
                        "never guesses them).")
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"{path} is not readable JSON ({e}). Restore the config.json that came with the "
                        "weights.") from None
    if not isinstance(raw, dict):
        raise DataError(f"{path} holds no JSON object. Restore the config.json that came with the weights.")
    model_type = raw.get("model_type")
    if model_type not in MODEL_TYPES:
        raise DataError(f"{path} has model_type {model_type!r}, which shardtrain does not load. Supported "
                        f"model_type values: {', '.join(sorted(MODEL_TYPES))} (docs/coming_from_hf.md).")
    family = FAMILIES[MODEL_TYPES[model_type]]
    values = family.from_hf(raw, path)
    return HfModelConfig(MODEL_TYPES[model_type], values, {k: family.SOURCES[k] for k in values},
                         raw["vocab_size"], raw)


def exports(model: str) -> bool:
    return model in FAMILIES


def to_folder_config(model: str, values: Dict, weights: Dict, max_positions: Optional[int], dtype: str,
                     extra: Optional[Dict] = None) -> Tuple[Dict, str]:
    """(config.json, transformers' class) for a model ``model`` with config ``values`` and ``weights`` (our
    names; they give the vocabulary)."""
    family = FAMILIES[model]
    return family.to_hf(values, family.vocab_size(weights), max_positions, dtype, extra)


def hf_name(model: str, name: str) -> str:
    """Hugging Face's name for our parameter ``name`` of a ``model``."""
    return KEYS[model].to_hf(name)


def our_name(model: str, name: str) -> Optional[str]:
    """Our name for Hugging Face's weight ``name``; None for one that is no weight of ours (rotary buffers)."""
    return KEYS[model].to_ours(name)
