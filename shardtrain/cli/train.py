"""``shard-train DATA --task ... --arch ...``: train a model."""
from shardtrain.cli.errors import cli_entry
from shardtrain.config.build import parse_train_args
from shardtrain.trainer import loop
from shardtrain.trainer.logging_setup import setup_logging


@cli_entry("shard-train")
def main(argv):
    cfg = parse_train_args(argv)
    setup_logging(cfg.common.log_file)
    loop.main(cfg)


if __name__ == "__main__":
    main()
