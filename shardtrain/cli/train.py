"""``shard-train DATA --task ... --arch ...``: train a model (on one or many processes)."""
import logging
import os

from shardtrain.cli.errors import cli_entry
from shardtrain.config.run_config import parse_train_command
from shardtrain.config.fairseq_compat import print_notices
from shardtrain.optim.fairseq_defaults import default_components_notice
from shardtrain.trainer import loop, preflight
from shardtrain.trainer.launch import rendezvous, start
from shardtrain.trainer.metrics.logging_setup import setup_logging

logger = logging.getLogger(__name__)


@cli_entry("shard-train")
def main(argv):
    cfg, notices = parse_train_command(argv)
    print_notices(notices, "shard-train")
    notice = default_components_notice(argv)
    if notice:  # logged once, by rank 0, before any rank starts
        launched = rendezvous.from_environment(os.environ, cfg.distributed.distributed_init_method)
        setup_logging(cfg.common.log_file, launched.rank if launched else 0)
        logger.info(notice)
    preflight.check_before_launch(cfg)  # before any rank starts
    return start.call_main(cfg, loop.main)


if __name__ == "__main__":
    main()
