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
import re
from typing import Dict, Optional, Tuple

import torch
from omegaconf import OmegaConf

from shardtrain.fairseq_import.fairseq_pickle import FairseqStandIn
from shardtrain.config.run_config import from_dict, to_dict
from shardtrain.core.errors import CheckpointError

logger = logging.getLogger(__name__)

# Fields that mean the same in fairseq's transformer_lm and ours.
SAME_MODEL_FIELDS = (
    "activation_fn", "dropout", "attention_dropout", "decoder_embed_dim", "decoder_output_dim",
    "decoder_input_dim", "decoder_ffn_embed_dim", "decoder_layers", "decoder_attention_heads",
    "decoder_normalize_before", "no_decoder_final_norm", "share_decoder_input_output_embed",
    "decoder_learned_pos", "no_scale_embedding", "layernorm_embedding", "no_token_positional_embeddings",
    "decoder_layerdrop",
)
# (fairseq option, set in a way we cannot represent when..., why)
UNSUPPORTED = (
    ("adaptive_softmax_cutoff", lambda v: v is not None, "adaptive softmax"),
    ("adaptive_input", bool, "adaptive input embeddings"),
    ("character_embeddings", bool, "character embeddings"),
    ("decoder_layers_to_keep", lambda v: v is not None, "pruned layers (--decoder-layers-to-keep)"),
    ("add_bos_token", bool, "a beginning-of-sentence token (--add-bos-token)"),
    ("scale_fc", bool, "NormFormer scaling (--scale-fc)"),
    ("scale_attn", bool, "NormFormer scaling (--scale-attn)"),
    ("scale_heads", bool, "NormFormer scaling (--scale-heads)"),
    ("scale_resids", bool, "NormFormer scaling (--scale-resids)"),
    ("base_layers", bool, "BASE layers (--base-layers)"),
    ("decoder_xformers_att_config", lambda v: v is not None, "xFormers attention"),
    ("output_dictionary_size", lambda v: v not in (None, -1), "a truncated output dictionary"),
    ("self_target", bool, "self targets (--self-target)"),
    ("past_target", bool, "past targets (--past-target)"),
)
# Options that act only while training in fairseq: dropped, with a note.
TRAINING_ONLY = ("quant_noise_pq", "quant_noise_scalar")
DEFAULT_MAX_TARGET_POSITIONS = 1024  # fairseq's, when neither it nor --tokens-per-sample is set


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


def model_values(model: Dict, task: Dict, path: str) -> Dict:
    """Our transformer_lm config fields from fairseq's model (and task) options."""
    # argparse-era: one namespace with "arch" and "task"; 0.10+: sections named by "_name"
    arch = model.get("arch") or model.get("_name") or ""
    task_name = task.get("task") or task.get("_name") or "language_modeling"
    if not str(arch).startswith("transformer_lm") or task_name != "language_modeling":
        raise CheckpointError(f"{path} is a fairseq {arch or 'unknown'} model of task {task_name}; only "
                              "transformer_lm language models (task language_modeling) can be imported.")
    options = {**task, **model}
    unsupported = [why for key, is_set, why in UNSUPPORTED if is_set(options.get(key))]
    if unsupported:
        raise CheckpointError(f"{path} uses {', '.join(unsupported)}, which shardtrain's transformer_lm does not "
                              "implement; such a model cannot be converted. Retrain without those options.")
    dropped = [key for key in TRAINING_ONLY if options.get(key)]
    if dropped:
        logger.info(f"dropped training-only fairseq options (no effect on the weights): {', '.join(dropped)}")
    values = {key: model[key] for key in SAME_MODEL_FIELDS if model.get(key) is not None}
    # fairseq's layer falls back to --relu-dropout, the option's old name.
    values["activation_dropout"] = model.get("activation_dropout") or model.get("relu_dropout") or 0.0
    if "decoder_final_norm" in model:  # another old name, as fairseq's base_lm_architecture reads it
        values["no_decoder_final_norm"] = not model["decoder_final_norm"]
    values["max_target_positions"] = (model.get("max_target_positions") or model.get("tokens_per_sample")
                                      or task.get("tokens_per_sample") or DEFAULT_MAX_TARGET_POSITIONS)
    return values


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


def convert_weights(fairseq_model: Dict[str, torch.Tensor], values: Dict, path: str) -> Dict[str, torch.Tensor]:
    """fairseq's ``decoder.*`` state dict under our names (fused qkv, ``blocks.N``)."""
    weights, pending = {}, {}
    for name, tensor in fairseq_model.items():
        _check_tensor(name, tensor, path)
        if not isinstance(name, str) or not name.startswith("decoder."):
            raise CheckpointError(f"{path} holds the weight {name!r} outside the decoder: it is not a "
                                  "transformer_lm checkpoint.")
        name = name[len("decoder."):]
        if _dropped(name, values):
            continue
        name = re.sub(r"^layers\.(\d+)\.", r"blocks.\1.", name)
        name = re.sub(r"self_attn\.in_proj_(weight|bias)$", r"self_attn.qkv_proj.\1", name)  # fairseq < 0.7
        name = "output_projection.weight" if name == "embed_out" else name  # fairseq < 0.10
        qkv = re.fullmatch(r"(blocks\.\d+\.self_attn\.)([qkv])_proj\.(weight|bias)", name)
        if qkv:
            pending.setdefault(qkv.group(1) + "qkv_proj." + qkv.group(3), {})[qkv.group(2)] = tensor
            continue
        weights[name] = _as_float32(tensor)
    for name, parts in pending.items():
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(f"{path} has only the {'/'.join(sorted(parts))} projections of {name}; "
                                  "the checkpoint is incomplete.")
        weights[name] = _as_float32(torch.cat([parts["q"], parts["k"], parts["v"]], dim=0))
    return weights


def _check_tensor(name, tensor, path: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise CheckpointError(f"{path} holds the weight {name!r} as a Python {type(tensor).__name__}, not a tensor: "
                              "the file is damaged or was not written by fairseq-train. Pass the checkpoint "
                              "fairseq-train wrote (checkpoint_best.pt, checkpoint_last.pt, ...).")


def _dropped(name: str, values: Dict) -> bool:
    """Buffers fairseq saves that carry no weights, and its copy of shared embeddings."""
    if name == "version" or name.endswith(".version") or name == "embed_positions._float_tensor":
        return True
    if name == "embed_positions.weights" and not values.get("decoder_learned_pos"):
        return True  # an old sinusoidal table; ours is recomputed
    shared = values.get("share_decoder_input_output_embed")
    return shared and name in ("output_projection.weight", "embed_out")


def _as_float32(tensor: torch.Tensor) -> torch.Tensor:
    # Our checkpoints hold fp32 weights (fp16 training keeps fp32 masters).
    return tensor.detach().float().contiguous() if tensor.is_floating_point() else tensor.detach().clone()


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
        "task": task_values(task, values["max_target_positions"], data),
        "model": values,
    })
    return {"cfg": to_dict(cfg), "model": convert_weights(state["model"], values, path)}
