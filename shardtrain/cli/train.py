"""``shard-train DATA --task ... --arch ...``: train a model (on one or many processes)."""
import logging
import os
from typing import List

from shardtrain.cli.errors import cli_entry
from shardtrain.config.run_config import parse_train_command
from shardtrain.config.fairseq_compat import print_notices
from shardtrain.optim.fairseq_defaults import default_components_notice
from shardtrain.trainer import preflight
from shardtrain.trainer.launch import rendezvous, start
from shardtrain.trainer.launch.preemption import STOPPED_AT_ONCE
from shardtrain.trainer.precision import cpu_speed
from shardtrain.trainer.metrics.logging_setup import setup_logging

logger = logging.getLogger(__name__)


def cpu_precision_warning(cfg) -> List[str]:
    """What --fp16 (or --bf16 without bfloat16 instructions) costs when the run trains on the CPU."""
    text = cpu_speed.warning(cfg.common, not start.training_on_cuda(cfg), cpu_speed.cpu_flags())
    return [text] if text else []


@cli_entry("shard-train", interrupted=STOPPED_AT_ONCE)
def main(argv):
    cfg, notices = parse_train_command(argv)
    print_notices(notices + cpu_precision_warning(cfg), "shard-train")
    notice = default_components_notice(argv)
    if notice:  # logged once, by rank 0, before any rank starts
        launched = rendezvous.from_environment(os.environ, cfg.distributed.distributed_init_method)
        setup_logging(cfg.common.log_file, launched.rank if launched else 0)
        logger.info(notice)
    preflight.check_before_launch(cfg)  # before any rank starts
    # The loop's imports (DCP, FSDP2: ~2 s) come after the checks, so a refusal does not wait for them.
    from shardtrain.trainer import loop
    return start.call_main(cfg, loop.main)


if __name__ == "__main__":
    main()
