"""``shard-preprocess --trainpref FILE --validpref FILE --destdir DIR``: text to a data-bin."""
from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.data.preprocess import PreprocessConfig, preprocess
from shardtrain.trainer.metrics.logging_setup import setup_logging

PROG = "shard-preprocess"


def parse_args(argv) -> PreprocessConfig:
    return flags.parse_dataclass(PreprocessConfig, argv, PROG, __doc__, title="preprocessing")


@cli_entry(PROG)
def main(argv):
    cfg = parse_args(argv)
    setup_logging()
    preprocess(cfg)  # SIGTERM and Ctrl-C clean up on the way out (see cli_entry)


if __name__ == "__main__":
    main()
