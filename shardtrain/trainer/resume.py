"""Where a run starts: fresh, from --restore-file, or from --finetune-from-model."""
import logging
import os
from typing import Dict

from shardtrain.errors import CheckpointError
from shardtrain.trainer.backends import unwrap
from shardtrain.trainer.checkpoints import load_checkpoint

logger = logging.getLogger(__name__)


def restore(run):
    """Load the restore checkpoint if there is one; return the epoch iterator to train on."""
    cfg, ck = run.cfg, run.cfg.checkpoint
    path = run.checkpoints.restore_path()
    if path is None and ck.finetune_from_model:
        # fairseq's rule: --finetune-from-model applies only to a fresh run;
        # once checkpoint_last exists, the run resumes from it instead.
        state = load_checkpoint(ck.finetune_from_model)
        load_model_weights(run.trainer, state, ck.finetune_from_model, cfg)
        logger.info(f"loaded model weights from {ck.finetune_from_model} (optimizer, lr scheduler, meters and "
                    "data position reset)")
        path = None
    if path is None:
        return run.batch_iterator(cfg.dataset.train_subset, epoch=1, shuffle=True)
    state = load_checkpoint(path)
    load_model_weights(run.trainer, state, path, cfg, load=False)
    try:
        run.trainer.load_state_dict(state, reset_optimizer=ck.reset_optimizer,
                                    reset_lr_scheduler=ck.reset_lr_scheduler)
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"Cannot resume from {path}: {str(e).splitlines()[0][:300]}. Its optimizer or "
                              "scheduler does not match this run; pass --reset-optimizer / "
                              "--reset-lr-scheduler to keep only the weights.") from None
    if not ck.reset_meters and "meters" in state:
        run.metrics.load_state_dict(state["meters"])
    iterator_state = state["train_iterator"]
    epoch_itr = run.batch_iterator(cfg.dataset.train_subset, epoch=1 if ck.reset_dataloader
                                   else iterator_state["epoch"], shuffle=True)
    if not ck.reset_dataloader:
        epoch_itr.load_state_dict(iterator_state)
    logger.info(f"loaded checkpoint {path} (epoch {iterator_state['epoch']} @ {run.trainer.num_updates} updates)")
    return epoch_itr


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
        if any("embed_tokens" in k for k in mismatched):
            vocab_hint = " The vocabulary differs: the checkpoint was trained on another dict.txt."
        raise CheckpointError(
            f"Checkpoint {path} does not fit this model ({detail}); it was saved with --arch {saved_arch} and "
            f"this run uses --arch {cfg.components.arch}.{vocab_hint} Use the same architecture and data-bin, "
            f"or start a new --save-dir.")
    if load:
        trainer.load_model(model)
