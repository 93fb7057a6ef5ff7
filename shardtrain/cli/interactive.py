"""``shard-interactive DATA --path CKPT``: continue each line of standard input, as fairseq-interactive.

The model loads once; every line read (``--input``, ``-`` for standard input) is a prompt, answered
at once with shard-generate's lines (``S-i``, ``W-i`` the seconds it took, then ``H-i``/``D-i``/``P-i``
per hypothesis, scores in base 2), ``i`` counting the lines from 0. A line that cannot be answered
(too long for the model) gets one ``error:`` line on standard error and the next line is read.
"""
import dataclasses
import fileinput
import logging
import sys
import time

from shardtrain.cli.errors import cli_entry
from shardtrain.cli.generate import DecodeConfig, Generator
from shardtrain.config import flags
from shardtrain.core.errors import ConfigError
from shardtrain.core.fields import field
from shardtrain.trainer.metrics.logging_setup import setup_logging

logger = logging.getLogger("shardtrain.interactive")


@dataclasses.dataclass
class InteractiveConfig(DecodeConfig):
    input: str = field("-", help="file to read the prompts from, one a line; - for standard input")
    buffer_size: int = field(0, help="accepted for fairseq's scripts: each line is answered as soon as it is read")


@cli_entry("shard-interactive")
def main(argv):
    args = flags.parse_dataclass(InteractiveConfig, argv, "shard-interactive", __doc__)
    setup_logging()
    generator = Generator(args)
    logger.info("NOTE: hypothesis and token scores are output in base 2")
    logger.info("Type the input sentence and press return:")
    answered = []
    with fileinput.input(files=[args.input], openhook=fileinput.hook_encoded("utf-8")) as lines:
        for index, line in enumerate(lines):
            prompt = line.strip()
            start = time.perf_counter()
            try:
                hypotheses = generator.hypotheses(prompt)
            except ConfigError as e:
                print(f"shard-interactive: error: line {index + 1}: {e}", file=sys.stderr, flush=True)
                continue
            seconds = time.perf_counter() - start
            answered.append(generator.print_prompt(index, prompt, hypotheses, seconds))
            sys.stdout.flush()  # a prompt typed at a terminal or written by a pipe is answered now
    return answered


if __name__ == "__main__":
    main()
