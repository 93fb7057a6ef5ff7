"""A fairseq ``transformer_lm`` checkpoint as one of ours: config and weights.

The model flags come from the checkpoint's own config (fairseq 0.10+:
``cfg['model']``/``cfg['task']``; older: the flat ``args`` namespace), which
holds the values after fairseq applied the architecture preset, so every field
is set explicitly here and our presets play no part. Weight names map as
listed in ``models/transformer_lm/model.py``; positions need no conversion, since
ours are numbered from ``padding_idx + 1`` exactly as fairseq's.
"""
import argparse
import logging
from typing import Dict, Optional, Tuple

from omegaconf import OmegaConf

from shardtrain.fairseq_import.fairseq_pickle import FairseqStandIn
from shardtrain.config.run_config import from_dict, to_dict
from shardtrain.core.errors import CheckpointError
from shardtrain.models.transformer_lm.fairseq_checkpoint import convert_weights, max_positions, model_values

logger = logging.getLogger(__name__)

def plain(value):
    """omegaconf containers, namespaces and fairseq stand-ins as plain Python values."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True, enum_to_str=True)
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, FairseqStandIn):
        return value.value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def fairseq_sections(state: Dict, path: str) -> Tuple[Dict, Dict, Dict]:
    """(model, task, dataset) options of a fairseq checkpoint."""
    cfg = plain(state.get("cfg"))
    if isinstance(cfg, dict) and isinstance(cfg.get("model"), dict) and cfg["model"]:
        return cfg["model"], _section(cfg, "task"), _section(cfg, "dataset")
    args = plain(state.get("args"))
    if isinstance(args, dict) and args:
        return args, args, args  # argparse-era fairseq: every option in one namespace
    raise CheckpointError(f"{path} has no model config (neither cfg['model'] nor args): it is not a fairseq "
                          "model checkpoint, or only its weights were saved. Pass the checkpoint fairseq-train "
                          "wrote (checkpoint_best.pt, checkpoint_last.pt, ...).")


def _section(cfg: Dict, name: str) -> Dict:
    section = cfg.get(name)
    return section if isinstance(section, dict) else {}


def task_values(task: Dict, max_positions: int, data: Optional[str]) -> Dict:
    return {
        "data": data or task.get("data") or "data-bin",
        "sample_break_mode": task.get("sample_break_mode") or "none",
        "tokens_per_sample": task.get("tokens_per_sample") or max_positions,
    }


def dataset_values(dataset: Dict) -> Dict:
    """fairseq's batching options (``max_sentences`` is --batch-size's old name)."""
    names = {"max_tokens": "max_tokens", "batch_size": "max_sentences", "max_tokens_valid": "max_tokens_valid",
             "batch_size_valid": "max_sentences_valid"}
    return {ours: dataset.get(ours) or dataset.get(old) for ours, old in names.items()}


def _kind(value) -> str:
    if value is None:
        return "None"
    return "an empty dict" if isinstance(value, dict) else f"a {type(value).__name__}"


def to_shardtrain(state: Dict, path: str, data: Optional[str] = None) -> Dict:
    """Our checkpoint's ``cfg`` and ``model`` from a loaded fairseq one. The
    caller adds ``version``, and ``task_fingerprint`` from the data-bin it checked."""
    if "model" not in state:
        raise CheckpointError(f"{path} has no model weights; pass the checkpoint fairseq-train wrote.")
    if not isinstance(state["model"], dict) or not state["model"]:
        raise CheckpointError(f"{path}'s model entry is {_kind(state['model'])}, not a dict of weight tensors: the "
                              "file is damaged or was not written by fairseq-train. Pass the checkpoint "
                              "fairseq-train wrote (checkpoint_best.pt, checkpoint_last.pt, ...).")
    model, task, dataset = fairseq_sections(state, path)
    values = model_values(model, task, path)
    cfg = from_dict({
        "components": {"task": "language_modeling", "arch": "transformer_lm", "criterion": "cross_entropy"},
        "common": {"seed": task.get("seed") or model.get("seed") or 1},
        "dataset": dataset_values(dataset),
        "task": task_values(task, max_positions(values), data),
        "model": values,
    })
    return {"cfg": to_dict(cfg), "model": convert_weights(state["model"], values, path)}
