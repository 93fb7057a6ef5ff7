"""``--attn-mask-type`` on the commands that score a checkpoint (``shard-validate``, ``shard-eval-lm``).

By default the checkpoint's own: a model trained with ``--attn-mask-type block_causal`` is scored within each
document, as its valid records were during training; ``causal`` scores a block's packed documents as one sequence
(what a model trained without the mask saw), ``block_causal`` the other way round.
"""
from typing import Optional

from shardtrain.core.errors import ConfigError
from shardtrain.core.fields import field
from shardtrain.tasks.language_modeling import ATTN_MASK_TYPES


def attn_mask_type_field():
    return field(None, choices=ATTN_MASK_TYPES, help=(
        "causal: a token sees every earlier token of its block; block_causal: only those of its own document "
        "(documents start at each </s>). Default: the checkpoint's (--attn-mask-type of the run that trained it)"))


def apply_attn_mask_type(task, asked: Optional[str]) -> None:
    """Set the task's mask to ``asked`` (None: keep the checkpoint's); refused for a task without the option."""
    if asked is None:
        return
    if not hasattr(task.cfg, "attn_mask_type"):
        raise ConfigError(
            f"--attn-mask-type {asked}: the checkpoint's task ({type(task).__name__}) has no attention mask "
            "option, so its batches cannot be given one. Drop --attn-mask-type (it is language_modeling's "
            "option; a task of your own decides its own batches).")
    task.cfg.attn_mask_type = asked
