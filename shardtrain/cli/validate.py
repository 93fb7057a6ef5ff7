"""``shard-validate DATA --path CKPT``: loss and perplexity of a checkpoint on a split, batched as the run that
trained it batched its validation (its document mask too, unless ``--attn-mask-type`` says otherwise)."""
import dataclasses
import logging
from typing import Optional

from shardtrain.cli.attn_mask_option import apply_attn_mask_type, attn_mask_type_field
from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.core.user_dir import LOADING_HELP as USER_DIR_HELP
from shardtrain.core.fields import field
from shardtrain.config.sections import LOG_FORMATS
from shardtrain.trainer.checkpoint.inference import evaluate, load_for_inference
from shardtrain.trainer.metrics.logging_setup import setup_logging
from shardtrain.trainer.metrics.meters import MetricsLogger
from shardtrain.trainer.metrics.progress import build_progress_bar
from shardtrain.trainer.resolved import Components, build_criterion
from shardtrain.trainer.precision.choose import inference_dtype

logger = logging.getLogger("shardtrain.validate")


@dataclasses.dataclass
class ValidateConfig:
    data: str = field(help="data-bin directory", positional=True)
    path: str = field(help="checkpoint to evaluate")
    valid_subset: str = field("valid", help="comma-separated splits to evaluate")
    max_tokens: Optional[int] = field(None, help="max tokens per batch (default: the checkpoint's)")
    batch_size: Optional[int] = field(None, help="max sequences per batch (default: the checkpoint's)")
    attn_mask_type: Optional[str] = attn_mask_type_field()
    cpu: bool = field(False, help="evaluate on the CPU even when CUDA is available")
    fp16: bool = field(False, help="load the weights straight into fp16 on the device and compute in fp16 "
                                   "(the loss/log-probs in fp32); no fp32 copy of the model is ever held")
    bf16: bool = field(False, help="load the weights straight into bf16 on the device and compute in bf16 "
                                   "(the loss/log-probs in fp32); no fp32 copy of the model is ever held")
    log_format: str = field("tqdm", help="log format (tqdm: a progress bar on a terminal, simple lines "
                                         "elsewhere)", choices=LOG_FORMATS)
    user_dir: Optional[str] = field(None, help=USER_DIR_HELP)


@cli_entry("shard-validate")
def main(argv):
    args = flags.parse_dataclass(ValidateConfig, argv, "shard-validate", __doc__)
    dtype = inference_dtype(args)
    setup_logging()
    cfg, task, model, device = load_for_inference(args.path, args.data, cpu=args.cpu, dtype=dtype,
                                                    user_dir=args.user_dir)
    apply_attn_mask_type(task, args.attn_mask_type)
    criterion = build_criterion(cfg, Components.of(cfg), task)
    results = {}
    for subset in args.valid_subset.split(","):
        itr = task.get_batch_iterator(
            subset, max_tokens=args.max_tokens or cfg.dataset.max_tokens_valid or cfg.dataset.max_tokens,
            max_sentences=args.batch_size or cfg.dataset.batch_size_valid or cfg.dataset.batch_size,
            seed=cfg.common.seed, shuffle=False).next_epoch_itr(shuffle=False)
        progress = build_progress_bar(itr, log_format=args.log_format, prefix=f"valid on '{subset}' subset")
        metrics = MetricsLogger()
        evaluate(criterion, model, progress, device, metrics)
        stats = metrics.smoothed_values()
        progress.print(stats, tag=subset, step=0)
        progress.close()
        results[subset] = stats
    return results


if __name__ == "__main__":
    main()
