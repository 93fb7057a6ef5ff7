"""``shard-consolidate IN OUT``: a sharded checkpoint directory to one file, or one file to a sharded directory.

The direction follows the input: a directory (as fully_sharded writes) becomes
one ``torch.save`` file (the model only with --model-only, which loads into a
plain ``nn.Module`` with ``load_state_dict``); a file becomes a directory that
resumes on any number of ranks.
"""
import dataclasses
import logging
import os

from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.config.fields import field
from shardtrain.errors import CheckpointError
from shardtrain.trainer.checkpoints import resolve_checkpoint_path
from shardtrain.trainer.consolidate import export_safetensors, file_to_sharded, sharded_to_file
from shardtrain.trainer.logging_setup import setup_logging

logger = logging.getLogger("shardtrain.consolidate")


@dataclasses.dataclass
class ConsolidateConfig:
    input: str = field(help="checkpoint to convert (a sharded directory or a single file)", positional=True)
    output: str = field(help="where to write the other form", positional=True)
    model_only: bool = field(False, help="directory -> file: keep only the model weights (and the config)")
    export_safetensors: bool = field(False, help="directory -> file: also write OUTPUT.safetensors (model weights)")


@cli_entry("shard-consolidate")
def main(argv):
    args = flags.parse_dataclass(ConsolidateConfig, argv, "shard-consolidate", __doc__)
    setup_logging()
    source = resolve_checkpoint_path(args.input)
    if not os.path.exists(source):
        raise CheckpointError(f"{args.input} does not exist. Pass a checkpoint file or directory.")
    if os.path.isdir(source):
        model = sharded_to_file(source, args.output, args.model_only)
        if args.export_safetensors:
            export_safetensors(model, os.path.splitext(args.output)[0] + ".safetensors")
        logger.info(f"wrote {args.output} ({'model only' if args.model_only else 'full training state'})")
    else:
        if args.model_only or args.export_safetensors:
            raise CheckpointError("--model-only and --export-safetensors apply when the input is a sharded "
                                  "directory; a single file is converted to a sharded directory whole.")
        file_to_sharded(source, args.output)
        logger.info(f"wrote sharded checkpoint {args.output}")


if __name__ == "__main__":
    main()
