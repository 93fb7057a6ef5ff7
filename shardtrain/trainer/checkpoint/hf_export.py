"""A checkpoint's model as a Hugging Face folder (``shard-consolidate CHECKPOINT --to-hf OUTDIR``).

``config.json`` (the family's mapping: models/llama/hf_config.py), the weights under Hugging Face's names in
safetensors files with ``{"format": "pt"}`` metadata (transformers' loader checks it), split at
``--max-shard-size`` with ``model.safetensors.index.json`` when there is more than one file, and the tokenizer
files: those of the folder the run was fine-tuned from when it holds a tokenizer.json, else those of its
data-bin when that was made with ``shard-preprocess --hf-tokenizer`` (whose token ids config.json then gets).
Written whole or not at all: everything goes into a temporary sibling directory, which is renamed to OUTDIR at
the end."""
import json
import logging
import os
import re
import shutil
from typing import Dict, List, Optional

import torch

from shardtrain.core.errors import CheckpointError, ConfigError, DataError
from shardtrain.core.fileio import fsync_dir, temp_sibling
from shardtrain.data.hf_vocab import parse_header
from shardtrain.models import ARCH_REGISTRY
from shardtrain.models.hf_config import CONFIG, FAMILIES, exports, hf_name, is_hf_folder, to_folder_config
from shardtrain.trainer.checkpoint.hf_folder import INDEX, WEIGHTS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json")
KEPT_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")  # token ids: the folder's, never a size
_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "KIB": 2 ** 10, "MIB": 2 ** 20,
          "GIB": 2 ** 30}
METADATA = {"format": "pt"}
logger = logging.getLogger(__name__)


def parse_size(text: str) -> int:
    """``--max-shard-size``: bytes, or a number with KB/MB/GB (powers of 10, as transformers) or KiB/MiB/GiB."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).upper() not in _UNITS or float(match.group(1)) <= 0:
        raise ConfigError(f"--max-shard-size {text!r} is not a size; give bytes or a number with KB, MB, GB "
                          "(or KiB, MiB, GiB), such as 5GB.")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def check_out_dir(path: str) -> None:
    """Before anything is read: OUTDIR may be absent or an empty directory, its parent must exist."""
    if os.path.lexists(path) and not (os.path.isdir(path) and not os.listdir(path)):
        raise CheckpointError(f"--to-hf {path} exists and is not an empty directory; shard-consolidate never "
                              "writes into or over another folder. Name a new directory (or remove that one).")
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise CheckpointError(f"The parent directory of --to-hf {path} does not exist; create it first.")


def family_of(state: Dict, source: str) -> str:
    """Our model name of the checkpoint, refused in one paragraph when its family has no Hugging Face layout."""
    arch = ((state.get("cfg") or {}).get("components") or {}).get("arch")
    model = ARCH_REGISTRY.get(arch).obj.model if arch in ARCH_REGISTRY else arch
    if not exports(model):
        raise CheckpointError(
            f"{source} holds a {model} model (--arch {arch}), which --to-hf does not export: it writes the "
            f"families whose layout Hugging Face's transformers has a class for, {', '.join(sorted(FAMILIES))} "
            "(Llama 3 and Qwen3: LlamaForCausalLM, Qwen3ForCausalLM). transformer_lm is fairseq's decoder, with "
            "learned or sinusoidal positions, LayerNorm and its own names, which no such class reads as it is. "
            "Keep it as a shardtrain checkpoint (shard-consolidate --model-only), or train an --arch llama model.")
    return model


def export(state: Dict, source: str, out_dir: str, max_shard_size: int) -> List[str]:
    """Write ``state``'s model (a checkpoint's model-only form) to ``out_dir``; returns the files written."""
    model = family_of(state, source)
    cfg = state["cfg"]
    weights = state["model"]
    start = (cfg.get("checkpoint") or {}).get("finetune_from_model")
    start = start if is_hf_folder(start) else None
    data_bin = _hf_data_bin((cfg.get("task") or {}).get("data"))
    has_tokenizer = start is not None and os.path.isfile(os.path.join(start, TOKENIZER_FILES[0]))
    tokenizer_dir = start if has_tokenizer else (data_bin or start)
    kept = _kept_keys(start) if start else _data_bin_ids(data_bin)
    config, _ = to_folder_config(model, cfg["model"], weights, (cfg.get("task") or {}).get("tokens_per_sample"),
                                 _dtype_name(weights), extra=kept)
    tensors = {hf_name(model, name): tensor.detach() for name, tensor in weights.items()}
    partial = temp_sibling(out_dir)
    os.mkdir(partial)
    try:
        written = _write_weights(tensors, partial, max_shard_size)
        with open(os.path.join(partial, CONFIG), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        written.append(CONFIG)
        for name in TOKENIZER_FILES if tokenizer_dir else ():
            if os.path.isfile(os.path.join(tokenizer_dir, name)):
                shutil.copyfile(os.path.join(tokenizer_dir, name), os.path.join(partial, name))
                written.append(name)
        fsync_dir(partial)
        os.rename(partial, out_dir)  # onto an absent or empty directory: atomic
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(out_dir)))
    return written


def _write_weights(tensors: Dict[str, torch.Tensor], directory: str, max_shard_size: int) -> List[str]:
    from safetensors.torch import save_file
    groups, size = [[]], 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > max_shard_size:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    count = len(groups)
    names = [WEIGHTS] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    for file, group in zip(names, groups):
        # contiguous copies: safetensors refuses tensors that share storage (tied embeddings) or are views
        save_file({name: tensors[name].contiguous().clone() for name in group}, os.path.join(directory, file),
                  metadata=METADATA)
    if count > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
                 "weight_map": {name: file for file, group in zip(names, groups) for name in group}}
        with open(os.path.join(directory, INDEX), "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
        names.append(INDEX)
    return names


def _dtype_name(weights: Dict) -> str:
    dtypes = {t.dtype for t in weights.values()}
    return str(dtypes.pop() if len(dtypes) == 1 else torch.float32).replace("torch.", "")


def _hf_data_bin(data) -> Optional[str]:
    """The run's data-bin (the first of a ``:``-separated list) when it is in a Hugging Face tokenizer's ids
    (``shard-preprocess --hf-tokenizer``): it holds that tokenizer's files, the ones a run trained from scratch
    hands on. None for any other data-bin, or one no longer there."""
    first = str(data).split(os.pathsep)[0] if data else None
    return first if first and _data_bin_spec(first) is not None else None


def _data_bin_spec(data_dir: str) -> Optional[Dict]:
    try:
        with open(os.path.join(data_dir, "dict.txt"), encoding="utf-8") as f:
            first_line = f.readline()
        return parse_header(first_line, os.path.join(data_dir, "dict.txt"))
    except (OSError, UnicodeDecodeError):  # the data-bin moved or is not one: the export has no tokenizer to copy
        return None
    except DataError as e:  # a damaged header: say why the export leaves the tokenizer out
        logger.warning("--to-hf writes no tokenizer files: %s", e)
        return None


def _data_bin_ids(data_dir: Optional[str]) -> Dict:
    """config.json's token ids from an HF data-bin's header: the ids its lines were made with."""
    spec = _data_bin_spec(data_dir) if data_dir else None
    if spec is None:
        return {}
    return {"bos_token_id": spec["bos"], "eos_token_id": spec["eos"], "pad_token_id": spec["pad"]}


def _kept_keys(start) -> Dict:
    if start is None or not os.path.isfile(os.path.join(start, CONFIG)):
        return {}
    try:
        with open(os.path.join(start, CONFIG)) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return {key: config[key] for key in KEPT_KEYS if key in config}
