"""``shard-import-fairseq FAIRSEQ.pt OUT.pt --data DATA_BIN``: a fairseq transformer_lm checkpoint as ours.

The model flags are read from the checkpoint's own config, the weights renamed
(q/k/v fused), and the result checked against DATA_BIN's dictionary and a
model built from the converted config. OUT.pt loads with
``torch.load(weights_only=True)`` in ``shard-validate --path``,
``shard-generate --path`` and ``shard-train --finetune-from-model``.
fairseq 0.12 checkpoints load safely; older ones pickle Python objects and
need --trust-checkpoint (read with an allow-listed unpickler).
"""
import dataclasses
import logging
import os

import torch

from shardtrain.checkpoint_import.fairseq_lm import to_shardtrain
from shardtrain.checkpoint_import.fairseq_pickle import load_fairseq_checkpoint, looks_like_fairseq
from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.config.build import from_dict
from shardtrain.config.fields import field
from shardtrain.errors import CheckpointError
from shardtrain.fileio import atomic_open
from shardtrain.trainer import build
from shardtrain.trainer.checkpoints import FORMAT_VERSION
from shardtrain.trainer.logging_setup import setup_logging

logger = logging.getLogger("shardtrain.import_fairseq")


@dataclasses.dataclass
class ImportFairseqConfig:
    input: str = field(help="fairseq transformer_lm checkpoint (checkpoint_best.pt, ...)", positional=True)
    output: str = field(help="where to write the shardtrain checkpoint", positional=True)
    data: str = field(help="the data-bin the model was trained on (its dict.txt must match the embeddings)")
    trust_checkpoint: bool = field(False, help="allow loading a checkpoint that pickles Python objects (fairseq "
                                   "< 0.12); this can run code, so only for files from a source you trust")


@cli_entry("shard-import-fairseq")
def main(argv):
    args = flags.parse_dataclass(ImportFairseqConfig, argv, "shard-import-fairseq", __doc__)
    setup_logging()
    if os.path.exists(args.input) and os.path.exists(args.output) and os.path.samefile(args.input, args.output):
        raise CheckpointError(f"The output {args.output} is the input checkpoint; choose another output path.")
    state = load_fairseq_checkpoint(args.input, trust=args.trust_checkpoint)
    if not looks_like_fairseq(state):
        raise CheckpointError(f"{args.input} is not a fairseq checkpoint (no args, cfg or optimizer_history "
                              "entries). A shardtrain checkpoint needs no import; pass it to --path directly.")
    checkpoint = {"version": FORMAT_VERSION, **to_shardtrain(state, args.input, data=args.data)}
    cfg = from_dict(checkpoint["cfg"])
    task = build.build_task(cfg)
    check_fits(checkpoint["model"], cfg, task, args)
    checkpoint["task_fingerprint"] = task.fingerprint()
    with atomic_open(args.output) as f:
        torch.save(checkpoint, f)
    updates = (state.get("optimizer_history") or [{}])[-1].get("num_updates")
    logger.info(f"wrote {args.output}: fairseq transformer_lm ({cfg.model.decoder_layers} layers, "
                f"{cfg.model.decoder_embed_dim} dims, {len(task.source_dictionary)} symbols"
                + (f", {updates} updates" if updates is not None else "") + ")")
    return args.output


def check_fits(weights, cfg, task, args) -> None:
    """The converted weights must be exactly what a model built from the converted
    config holds (built on the meta device: no memory, no initialisation cost)."""
    rows, symbols = weights["embed_tokens.weight"].size(0), len(task.source_dictionary)
    if rows != symbols:
        raise CheckpointError(
            f"{args.input} embeds {rows} symbols but {args.data}/dict.txt gives {symbols}: the model was trained "
            "with another dictionary. Pass the data-bin fairseq-train used (--data).")
    with torch.device("meta"):
        model = build.build_model(cfg, task)
    own = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    got = {name: tuple(t.shape) for name, t in weights.items()}
    missing, unexpected = sorted(set(own) - set(got)), sorted(set(got) - set(own))
    reshaped = [name for name in own if name in got and own[name] != got[name]]
    problems = [f"{label} {names[:3]}" for label, names in
                (("missing", missing), ("unexpected", unexpected), ("shapes differ for", reshaped)) if names]
    if problems:
        raise CheckpointError(
            f"{args.input}'s weights do not match its own config ({'; '.join(problems)}): the checkpoint uses a "
            "fairseq variant this converter does not know. Please report it with the fairseq version.")


if __name__ == "__main__":
    main()
