"""Where a run starts: fresh, from --restore-file, or from --finetune-from-model."""
import logging
import time
from typing import Dict, List

from shardtrain.core import user_dir
from shardtrain.core.errors import CheckpointError
from shardtrain.models.hf_config import is_hf_folder
from shardtrain.trainer.checkpoint.contents import NO_OPTIMIZER_STATE, TENSOR_PARTS, load_parts, trainer_parts, without
from shardtrain.trainer.checkpoint.fit import check_same_optimizer
from shardtrain.trainer.checkpoint.choose import format_of
from shardtrain.trainer.checkpoint.formats import resolve_checkpoint_path
from shardtrain.trainer.checkpoint.hf_folder import load_folder_into

logger = logging.getLogger(__name__)


def restore(cfg, checkpoints, trainer, parts: Dict):
    """Load the restore checkpoint, if there is one, into ``parts`` (a run's stateful parts for
    loading: contents.stateful_parts); return the epoch iterator to train on."""
    checkpoint = cfg.checkpoint
    path = checkpoints.restore_path()
    if path is None and checkpoint.finetune_from_model:
        # fairseq's rule: --finetune-from-model applies only to a fresh run;
        # once checkpoint_last exists, the run resumes from it instead.
        finetune_from(cfg, trainer, resolve_checkpoint_path(checkpoint.finetune_from_model))
    make_epoch = parts["train_iterator"].make_epoch
    if path is None:
        return make_epoch(1)
    parts = without(parts, skipped_parts(checkpoint))
    started = time.perf_counter()
    try:
        state = _load(cfg, trainer, parts, path)
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"Cannot resume from {path}: {str(e).splitlines()[0][:300]}. Its optimizer or "
                              "scheduler does not match this run; pass --reset-optimizer / "
                              "--reset-lr-scheduler to keep only the weights.") from None
    epoch_itr = parts["train_iterator"].epoch_itr if "train_iterator" in parts else make_epoch(1)
    logger.info(f"loaded checkpoint {path} (epoch {state['train_iterator']['epoch']} @ {trainer.num_updates} "
                f"updates) in {time.perf_counter() - started:.1f} s")
    return epoch_itr


def skipped_parts(checkpoint) -> List[str]:
    """The parts the --reset-* flags (of the ``checkpoint`` section) leave as a fresh run has them."""
    resets = {"optimizer": checkpoint.reset_optimizer, "precision": checkpoint.reset_optimizer,
              "lr_scheduler": checkpoint.reset_lr_scheduler, "meters": checkpoint.reset_meters,
              "train_iterator": checkpoint.reset_dataloader}
    return [name for name, reset in resets.items() if reset]


def _load(cfg, trainer, parts: Dict, path: str) -> Dict:
    """Check the checkpoint fits, then load its tensors and every other part; return its state."""
    fmt = format_of(path)
    state = fmt.read_state(path)
    user_dir.warn_if_resumed_with_other_code(cfg.common.user_dir, state, path)
    fmt.check_model(trainer, state, path, cfg)
    if state.get(NO_OPTIMIZER_STATE) and "optimizer" in parts:
        logger.warning(f"{path} was saved with --no-save-optimizer-state: the optimizer starts fresh (the "
                       "weights, lr scheduler, meters and data position resume)")
        parts = without(parts, ["optimizer"])
    else:
        check_same_optimizer(state, path, cfg)
    fmt.load_tensors(path, state, parts["model"], parts.get("optimizer"))
    load_parts(without(parts, TENSOR_PARTS), state)
    trainer.resumed()
    return state


def finetune_from(cfg, trainer, source: str) -> None:
    """Only the model weights; the optimizer, scheduler, meters and data position start fresh. A Hugging Face
    folder (its config.json already made the model: config/hf_start.py) is read by rows (hf_folder.py)."""
    if is_hf_folder(source):
        started = time.perf_counter()
        load_folder_into(trainer.model, source)
        logger.info(f"loaded the Hugging Face folder {source} in {time.perf_counter() - started:.1f} s (optimizer, "
                    "lr scheduler, meters and data position fresh)")
        return
    fmt = format_of(source)
    state = fmt.read_state(source, model_only=True)
    user_dir.warn_if_resumed_with_other_code(cfg.common.user_dir, state, source)
    fmt.check_model(trainer, state, source, cfg)
    fmt.load_tensors(source, state, trainer_parts(trainer)["model"])
    logger.info(f"loaded model weights from {source} (optimizer, lr scheduler, meters and "
                "data position reset)")
