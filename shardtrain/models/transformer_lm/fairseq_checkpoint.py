"""How a fairseq 0.12 ``transformer_lm`` checkpoint's model options and weights become this family's: the
family's own knowledge of fairseq (field names, options it cannot represent, weight names), kept here so that
nothing outside ``models/`` names a family's config fields. ``shardtrain.fairseq_import`` reads the file, its
sections and the task and batching options, and calls these two functions.

The model options come from the checkpoint's own config, which holds the values after fairseq applied the
architecture preset, so every field is set explicitly and our presets play no part. Positions need no
conversion: ours are numbered from ``padding_idx + 1`` exactly as fairseq's.
"""
import logging
import re
from typing import Dict

import torch

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


def max_positions(values: Dict) -> int:
    """The longest sequence of a model with the config ``values`` (what --tokens-per-sample defaults to)."""
    return values["max_target_positions"]


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
