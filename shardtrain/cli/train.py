"""``shard-train DATA --task ... --arch ...``: train a model (on one or many processes)."""
from shardtrain.cli.errors import cli_entry
from shardtrain.config.build import parse_train_command
from shardtrain.config.fairseq_compat import print_notices
from shardtrain.trainer import loop
from shardtrain.trainer.launch import start


@cli_entry("shard-train")
def main(argv):
    cfg, notices = parse_train_command(argv)
    print_notices(notices, "shard-train")
    return start.call_main(cfg, loop.main)


if __name__ == "__main__":
    main()
