"""Where a run starts: fresh, from --restore-file, or from --finetune-from-model."""
import logging
import os
from typing import Dict

from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.parallel.backends import unwrap
from shardtrain.config.build import to_dict
from shardtrain.trainer.checkpoint.manager import load_checkpoint, resolve_checkpoint_path
from shardtrain.trainer.rng import reseed_for_resume, rng_for_this_rank
from shardtrain.trainer.checkpoint.sharded import is_sharded, load_extra, load_sharded_into

logger = logging.getLogger(__name__)


def restore(run):
    """Load the restore checkpoint if there is one; return the epoch iterator to train on."""
    cfg, ck = run.cfg, run.cfg.checkpoint
    path = run.checkpoints.restore_path()
    if path is None and ck.finetune_from_model:
        # fairseq's rule: --finetune-from-model applies only to a fresh run;
        # once checkpoint_last exists, the run resumes from it instead.
        source = resolve_checkpoint_path(ck.finetune_from_model)
        if is_sharded(source):
            check_same_model(run.trainer, load_extra(source), source, cfg)
            load_sharded_into(source, run.trainer.model, None)
        else:
            load_model_weights(run.trainer, load_checkpoint(source, model_only=True), source, cfg)
        logger.info(f"loaded model weights from {source} (optimizer, lr scheduler, meters and "
                    "data position reset)")
        path = None
    if path is None:
        return run.batch_iterator(cfg.dataset.train_subset, epoch=1, shuffle=True)
    try:
        state = _load_trainer_state(run.trainer, path, cfg)
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"Cannot resume from {path}: {str(e).splitlines()[0][:300]}. Its optimizer or "
                              "scheduler does not match this run; pass --reset-optimizer / "
                              "--reset-lr-scheduler to keep only the weights.") from None
    run.trainer.state.prev_training_time = state.get("training_seconds", 0.0)
    if not ck.reset_meters and "meters" in state:
        run.metrics.load_state_dict(state["meters"])
    iterator_state = state["train_iterator"]
    epoch_itr = run.batch_iterator(cfg.dataset.train_subset, epoch=1 if ck.reset_dataloader
                                   else iterator_state["epoch"], shuffle=True)
    if not ck.reset_dataloader:
        epoch_itr.load_state_dict(iterator_state)
    logger.info(f"loaded checkpoint {path} (epoch {iterator_state['epoch']} @ {run.trainer.num_updates} updates)")
    return epoch_itr


def _load_trainer_state(trainer, path: str, cfg) -> Dict:
    """Load a single-file or sharded checkpoint into ``trainer``; return its other state."""
    ck = cfg.checkpoint
    if not is_sharded(path):
        state = load_checkpoint(path)
        check_same_optimizer(state, path, cfg)
        load_model_weights(trainer, state, path, cfg, load=False)
        _own_rng(state, cfg.common.seed)
        trainer.load_state_dict(state, reset_optimizer=ck.reset_optimizer, reset_lr_scheduler=ck.reset_lr_scheduler)
        return state
    state = load_extra(path)
    check_same_model(trainer, state, path, cfg)
    check_same_optimizer(state, path, cfg)
    load_sharded_into(path, trainer.model, None if ck.reset_optimizer else trainer.optimizer)
    _own_rng(state, cfg.common.seed)
    trainer.load_extra_state(state, reset_optimizer=ck.reset_optimizer, reset_lr_scheduler=ck.reset_lr_scheduler)
    return state


def _own_rng(state: Dict, seed: int) -> None:
    """Each rank resumes its own generators (the trainer restores ``train_state["rng"]``)
    when the checkpoint was saved by this many ranks; otherwise they are re-seeded now.
    The ``rng`` saved there is rank 0's, never restored on other ranks."""
    own = rng_for_this_rank(state)
    if own is None:
        reseed_for_resume(state, seed)
    state["train_state"]["rng"] = own


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
            f"Checkpoint {path} was saved with another model (--arch {saved['components']['arch']} and its size "
            f"flags); this run uses --arch {cfg.components.arch}. Use the same architecture, or start a new "
            "--save-dir.")


def check_fingerprint(task, state: Dict, path: str) -> None:
    saved, own = state.get("task_fingerprint") or {}, task.fingerprint()
    differs = sorted(k for k in saved.keys() & own.keys() if saved[k] != own[k])
    if differs:
        raise CheckpointError(
            f"Checkpoint {path} was trained on other data: its {', '.join(differs)} differs from this data-bin's "
            "(the vocabulary differs: another dict.txt). Use the data-bin the checkpoint was trained on, or "
            "start a new --save-dir.")


def load_model_weights(trainer, state: Dict, path: str, cfg, load: bool = True) -> None:
    """Check that a checkpoint's model fits this run's, then (optionally) load it."""
    check_fingerprint(trainer.task, state, path)
    saved = state["cfg"]
    saved_arch = saved.get("components", {}).get("arch")
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
            f"Checkpoint {path} does not fit this model ({detail}); it was saved with --arch {saved_arch} and "
            f"this run uses --arch {cfg.components.arch} (compare their model size flags).{vocab_hint} "
            "Use the same architecture and data-bin, or start a new --save-dir.")
    if load:
        trainer.load_model(model)
