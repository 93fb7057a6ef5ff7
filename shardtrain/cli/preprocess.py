"""``shard-preprocess --trainpref FILE --validpref FILE --destdir DIR``: text to a data-bin."""
from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.data.preprocess import PreprocessConfig, preprocess
from shardtrain.trainer.logging_setup import setup_logging


def parse_args(argv) -> PreprocessConfig:
    return flags.parse_dataclass(PreprocessConfig, argv, "shard-preprocess", __doc__, title="preprocessing")


@cli_entry("shard-preprocess")
def main(argv):
    cfg = parse_args(argv)
    setup_logging()
    preprocess(cfg)


if __name__ == "__main__":
    main()
