"""``shard-consolidate IN OUT``: a sharded checkpoint directory to one file, or one file to a sharded directory.

The direction follows the input: a directory (as fully_sharded writes) becomes
one ``torch.save`` file (the model only with --model-only, which loads into a
plain ``nn.Module`` with ``load_state_dict``); a file becomes a directory that
resumes on any number of ranks. An existing OUT is refused unless --overwrite.
"""
import dataclasses
import logging
import os

from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.core.fields import field
from shardtrain.core.errors import CheckpointError
from shardtrain.core.fileio import atomic_write_bytes
from shardtrain.trainer.checkpoint.consolidate import (check_output, describe, file_to_sharded, read_sharded,
                                                       require_safetensors, safetensors_bytes, write_file)
from shardtrain.trainer.checkpoint.formats import format_of, resolve_checkpoint_path
from shardtrain.trainer.checkpoint.single_file import SingleFile
from shardtrain.core.timing import timed
from shardtrain.trainer.metrics.logging_setup import setup_logging

logger = logging.getLogger("shardtrain.consolidate")


@dataclasses.dataclass
class ConsolidateConfig:
    input: str = field(help="checkpoint to convert (a sharded directory or a single file)", positional=True)
    output: str = field(help="where to write the other form (must not exist, unless --overwrite)", positional=True)
    model_only: bool = field(False, help="directory -> file: keep only the model weights (and the config)")
    export_safetensors: bool = field(False, help="directory -> file: also write OUTPUT.safetensors (model weights)")
    overwrite: bool = field(False, help="replace an existing output file (or sharded checkpoint directory); "
                                        "without it an existing output is refused")


@cli_entry("shard-consolidate")
def main(argv):
    args = flags.parse_dataclass(ConsolidateConfig, argv, "shard-consolidate", __doc__)
    setup_logging()
    source = resolve_checkpoint_path(args.input)
    if not os.path.exists(source):
        raise CheckpointError(f"{args.input} does not exist. Pass a checkpoint file or directory.")
    if not isinstance(format_of(source), SingleFile):  # the direction follows the input's format
        with timed(logger, f"consolidating {source} into one file"):
            written = _to_file(source, args)
        logger.info(f"wrote {args.output} ({'model only' if args.model_only else describe(written)})")
    else:
        if args.model_only or args.export_safetensors:
            raise CheckpointError("--model-only and --export-safetensors apply when the input is a sharded "
                                  "directory; a single file is converted to a sharded directory whole.")
        with timed(logger, f"sharding {source} into a directory"):
            written = file_to_sharded(source, args.output, args.overwrite)
        logger.info(f"wrote sharded checkpoint {args.output} ({describe(written)})")


def _to_file(source: str, args) -> dict:
    """Directory -> file (and OUTPUT.safetensors): every output is checked before any is written."""
    check_output(args.output, args.overwrite, directory=False)
    extra_path = os.path.splitext(args.output)[0] + ".safetensors" if args.export_safetensors else None
    if extra_path:
        require_safetensors()
        if os.path.abspath(extra_path) == os.path.abspath(args.output):
            raise CheckpointError(f"The output {args.output} would be overwritten by its own safetensors export; "
                                  "name the output with another extension, such as .pt.")
        check_output(extra_path, args.overwrite, directory=False)
    state = read_sharded(source, args.model_only)
    weights = safetensors_bytes(state["model"]) if extra_path else None  # before writing: no half export
    write_file(state, args.output)
    if extra_path:
        atomic_write_bytes(extra_path, weights)
    return state


if __name__ == "__main__":
    main()
