"""``shard-consolidate IN OUT``: a sharded checkpoint directory to one file, or one file to a sharded directory.

The direction follows the input: a directory (as fully_sharded writes) becomes
one ``torch.save`` file; a file becomes a directory that resumes on any number
of ranks. --model-only writes one file from either form: a dict of the model's
weights under ``model`` (``module.load_state_dict(torch.load(OUT)["model"])``) with
the config and header beside them, so shard-validate and --finetune-from-model
read it too. An existing OUT is refused unless --overwrite.
"""
import dataclasses
import logging
import os
from typing import Optional

from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.core.fields import field
from shardtrain.core.errors import CheckpointError
from shardtrain.core.fileio import atomic_write_bytes
from shardtrain.trainer.checkpoint.consolidate import (check_output, describe, file_to_sharded, read_file_model_only,
                                                       read_sharded, require_safetensors, safetensors_bytes,
                                                       write_file)
from shardtrain.trainer.checkpoint.choose import format_of
from shardtrain.trainer.checkpoint.formats import resolve_checkpoint_path
from shardtrain.trainer.checkpoint import hf_export
from shardtrain.trainer.checkpoint.single_file import SingleFile
from shardtrain.core.timing import timed
from shardtrain.trainer.metrics.logging_setup import setup_logging

logger = logging.getLogger("shardtrain.consolidate")


@dataclasses.dataclass
class ConsolidateConfig:
    input: str = field(help="checkpoint to convert (a sharded directory or a single file)", positional=True)
    output: Optional[str] = field(None, help="where to write the other form (must not exist, unless --overwrite); "
                                             "left out with --to-hf", positional=True)
    model_only: bool = field(False, help="write one file with only the model weights (under 'model') and the "
                                         "config, from a sharded directory or a single file")
    export_safetensors: bool = field(False, help="directory -> file, or --model-only: also write OUTPUT.safetensors "
                                                 "(model weights)")
    overwrite: bool = field(False, help="replace an existing output file (or sharded checkpoint directory); "
                                        "without it an existing output is refused")
    to_hf: Optional[str] = field(None, help="write the model as a Hugging Face folder here instead (config.json, "
                                            "safetensors, index, tokenizer files); it must not exist or be empty")
    max_shard_size: str = field("5GB", help="with --to-hf: the largest safetensors file (bytes, or with KB, MB, "
                                            "GB, KiB, MiB, GiB); a larger model is split into files with an index")


@cli_entry("shard-consolidate")
def main(argv):
    args = flags.parse_dataclass(ConsolidateConfig, argv, "shard-consolidate", __doc__)
    setup_logging()
    source = resolve_checkpoint_path(args.input)
    if not os.path.exists(source):
        raise CheckpointError(f"{args.input} does not exist. Pass a checkpoint file or directory.")
    single_file = isinstance(format_of(source), SingleFile)
    if args.to_hf is not None:
        return _to_hf(source, args, single_file)
    if args.output is None:
        raise CheckpointError("Name the OUTPUT to write (a file, or a sharded directory for a file input), or "
                              "pass --to-hf OUTDIR for a Hugging Face folder.")
    if not single_file or args.model_only:  # the direction follows the input's format, unless --model-only
        with timed(logger, f"{'consolidating' if not single_file else 'keeping the model of'} {source} in one file"):
            written = _to_file(source, args, single_file)
        logger.info(f"wrote {args.output} ({'model only' if args.model_only else describe(written)})")
    else:
        if args.export_safetensors:
            raise CheckpointError("--export-safetensors applies when the output is one file: a sharded directory "
                                  "as input, or --model-only. A single file without --model-only is converted to a "
                                  "sharded directory whole; add --model-only to export its weights.")
        with timed(logger, f"sharding {source} into a directory"):
            written = file_to_sharded(source, args.output, args.overwrite)
        logger.info(f"wrote sharded checkpoint {args.output} ({describe(written)})")


def _to_file(source: str, args, single_file: bool) -> dict:
    """Directory (or, --model-only, a file) -> file (and OUTPUT.safetensors): every output is checked before
    any is written."""
    check_output(args.output, args.overwrite, directory=False)
    extra_path = os.path.splitext(args.output)[0] + ".safetensors" if args.export_safetensors else None
    if extra_path:
        require_safetensors()
        if os.path.abspath(extra_path) == os.path.abspath(args.output):
            raise CheckpointError(f"The output {args.output} would be overwritten by its own safetensors export; "
                                  "name the output with another extension, such as .pt.")
        check_output(extra_path, args.overwrite, directory=False)
    state = read_file_model_only(source) if single_file else read_sharded(source, args.model_only)
    weights = safetensors_bytes(state["model"]) if extra_path else None  # before writing: no half export
    write_file(state, args.output)
    if extra_path:
        atomic_write_bytes(extra_path, weights)
    return state


def _to_hf(source: str, args, single_file: bool) -> None:
    """The flags and OUTDIR checked before anything is read, the family before anything is written."""
    if args.output is not None or args.model_only or args.export_safetensors or args.overwrite:
        raise CheckpointError("--to-hf OUTDIR is the whole output: drop OUTPUT, --model-only, --export-safetensors "
                              "and --overwrite (a Hugging Face folder is never written over another).")
    max_shard_size = hf_export.parse_size(args.max_shard_size)
    hf_export.check_out_dir(args.to_hf)
    require_safetensors()
    with timed(logger, f"exporting {source} as a Hugging Face folder"):
        state = read_file_model_only(source) if single_file else read_sharded(source, model_only=True)
        written = hf_export.export(state, source, args.to_hf, max_shard_size)
    logger.info(f"wrote {args.to_hf} ({len(written)} files: {', '.join(written[-3:])}, ...)")


if __name__ == "__main__":
    main()
