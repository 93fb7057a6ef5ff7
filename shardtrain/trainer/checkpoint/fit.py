"""Does a checkpoint fit this run? Errors that name the flags to change, before anything is loaded."""
from typing import Dict

from shardtrain.config.run_config import to_dict
from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.parallel.choose import unwrap


def check_same_optimizer(state: Dict, path: str, cfg) -> None:
    """Another --optimizer keeps other state: say so, rather than fail on its contents."""
    if cfg.checkpoint.reset_optimizer:
        return
    saved = (state.get("cfg") or {}).get("components", {}).get("optimizer")
    current = cfg.components.optimizer
    if saved is not None and saved != current:
        raise CheckpointError(
            f"{path} was saved with --optimizer {saved}, but this run uses --optimizer {current}, whose state "
            f"differs. Resume with --optimizer {saved}, or pass --reset-optimizer to start {current} fresh from "
            "the saved weights (the lr scheduler, meters and data position still resume).")


def check_same_model(trainer, state: Dict, path: str, cfg) -> None:
    """A sharded checkpoint's shapes are only known to DCP, so compare the config fields that set
    them (sizes and switches; float fields such as dropouts may change)."""
    check_fingerprint(trainer.task, state, path)
    saved = state["cfg"]

    def shape_fields(model_cfg):
        return {k: v for k, v in (model_cfg or {}).items() if not isinstance(v, float)}

    if shape_fields(saved.get("model")) != shape_fields(to_dict(cfg)["model"]):
        raise CheckpointError(
            f"Checkpoint {path} was saved with another model: {_model_difference(saved, cfg)}. Use the same "
            "architecture, or start a new --save-dir.")


def _model_difference(saved: Dict, cfg) -> str:
    """The --arch of each, or (the same --arch) the size flags that differ, with both values."""
    saved_arch, arch = saved.get("components", {}).get("arch"), cfg.components.arch
    if saved_arch != arch:
        return f"it was saved with --arch {saved_arch} and this run uses --arch {arch} (compare their size flags)"
    theirs, ours = saved.get("model") or {}, to_dict(cfg)["model"]
    flags = [f"--{k.replace('_', '-')} {theirs[k]} in the checkpoint, {ours[k]} in this run"
             for k in sorted(theirs.keys() & ours.keys()) if theirs[k] != ours[k] and not isinstance(ours[k], float)]
    return f"both use --arch {arch}, but {'; '.join(flags) or 'its size flags differ'}"


def check_fingerprint(task, state: Dict, path: str) -> None:
    saved, own = state.get("task_fingerprint") or {}, task.fingerprint()
    differs = sorted(k for k in saved.keys() & own.keys() if saved[k] != own[k])
    if differs:
        raise CheckpointError(
            f"Checkpoint {path} was trained on other data: its {', '.join(differs)} differs from this data-bin's "
            "(the vocabulary differs: another dict.txt). Use the data-bin the checkpoint was trained on, or "
            "start a new --save-dir.")


def check_model_fits(trainer, state: Dict, path: str, cfg) -> None:
    """A single file's tensors are at hand: compare their names and shapes with this run's model."""
    check_fingerprint(trainer.task, state, path)
    saved = state["cfg"]
    model = state["model"]
    own = unwrap(trainer.model).state_dict()
    mismatched = [k for k, v in model.items() if k in own and tuple(own[k].shape) != tuple(v.shape)]
    missing = sorted(set(own) - set(model))
    unexpected = sorted(set(model) - set(own))
    if mismatched or missing or unexpected:
        detail = (f"shapes differ for {mismatched[:3]}" if mismatched else
                  f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}")
        vocab_hint = ""
        # Only a different number of embedding rows means another dict.txt; other
        # columns mean another --decoder-embed-dim.
        if any("embed_tokens" in k and own[k].shape[0] != model[k].shape[0] for k in mismatched):
            vocab_hint = " The vocabulary differs: the checkpoint was trained on another dict.txt."
        raise CheckpointError(
            f"Checkpoint {path} does not fit this model ({detail}); {_model_difference(saved, cfg)}.{vocab_hint} "
            "Use the same architecture and data-bin, or start a new --save-dir.")
