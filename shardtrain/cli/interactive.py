"""``shard-interactive DATA --path CKPT``: continue each line of standard input, as fairseq-interactive.

The model loads once; every line read (``--input``, ``-`` for standard input) is a prompt, answered
at once with shard-generate's lines (``S-i``, ``W-i`` the seconds it took, then ``H-i``/``D-i``/``P-i``
per hypothesis, scores in base 2), ``i`` counting the lines from 0. A line that cannot be answered
(too long for the model) gets one ``error:`` line on standard error and the next line is read.
"""
import dataclasses
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
    for index, line in enumerate(_prompts(args.input)):
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


def _prompts(path: str):
    """The lines of ``path`` (``-``: standard input, which Python decodes leniently). A file is read
    line by line, so that the lines before one that is not UTF-8 text are answered before it is
    refused in one paragraph; so is a file that cannot be read."""
    if path == "-":
        yield from sys.stdin
        return
    try:
        with open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ConfigError(
                        f"--input {path} is not UTF-8 text: line {number} has the byte 0x{raw[e.start]:02x}, which "
                        "UTF-8 does not allow there (a binary file, or text in another encoding). shard-interactive "
                        "reads prompts, one a line: convert the file to UTF-8 (iconv -t UTF-8) or pass the text "
                        "file meant.") from None
                yield line
    except OSError as e:
        raise ConfigError(f"--input {path} cannot be read ({e.strerror or e}): pass a text file of prompts, one a "
                          "line, or - for standard input.") from None

if __name__ == "__main__":
    main()
