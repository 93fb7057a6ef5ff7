"""``shard-import-fairseq FAIRSEQ.pt OUT.pt --data DATA_BIN``: a fairseq transformer_lm checkpoint as ours.

The model flags are read from the checkpoint's own config, the weights renamed
(q/k/v fused), and the result checked against DATA_BIN's dictionary and a
model built from the converted config. OUT.pt loads with
``torch.load(weights_only=True)`` in ``shard-validate --path``,
``shard-generate --path`` and ``shard-train --finetune-from-model``.
fairseq 0.12 checkpoints load safely; older ones pickle Python objects and
need --trust-checkpoint (read with an allow-listed unpickler). An existing
OUT.pt is refused unless --overwrite.
"""
import dataclasses
import logging
import os

import torch

from shardtrain.fairseq_import.fairseq_lm import to_shardtrain
from shardtrain.fairseq_import.fairseq_pickle import load_fairseq_checkpoint, looks_like_fairseq
from shardtrain.cli.errors import cli_entry
from shardtrain.config import flags
from shardtrain.config.run_config import from_dict
from shardtrain.core.fields import field
from shardtrain.core.errors import CheckpointError
from shardtrain.core.fileio import atomic_open
from shardtrain.trainer.checkpoint.contents import FORMAT_VERSION
from shardtrain.trainer.checkpoint.consolidate import check_output
from shardtrain.trainer.metrics.logging_setup import setup_logging
from shardtrain.trainer.resolved import Components, build_model, build_task

logger = logging.getLogger("shardtrain.import_fairseq")


@dataclasses.dataclass
class ImportFairseqConfig:
    input: str = field(help="fairseq transformer_lm checkpoint (checkpoint_best.pt, ...)", positional=True)
    output: str = field(help="where to write the shardtrain checkpoint (must not exist, unless --overwrite)",
                        positional=True)
    data: str = field(help="the data-bin the model was trained on (its dict.txt must match the embeddings)")
    trust_checkpoint: bool = field(False, help="allow loading a checkpoint that pickles Python objects (fairseq "
                                   "< 0.12); this can run code, so only for files from a source you trust")
    overwrite: bool = field(False, help="replace an existing output file; without it an existing output is refused")


@cli_entry("shard-import-fairseq")
def main(argv):
    args = flags.parse_dataclass(ImportFairseqConfig, argv, "shard-import-fairseq", __doc__)
    setup_logging()
    if os.path.exists(args.input) and os.path.exists(args.output) and os.path.samefile(args.input, args.output):
        raise CheckpointError(f"The output {args.output} is the input checkpoint; choose another output path.")
    check_output(args.output, args.overwrite, directory=False)
    state = load_fairseq_checkpoint(args.input, trust=args.trust_checkpoint)
    if not looks_like_fairseq(state):
        raise CheckpointError(not_fairseq(state, args.input))
    checkpoint = {"version": FORMAT_VERSION, **to_shardtrain(state, args.input, data=args.data)}
    cfg = from_dict(checkpoint["cfg"])
    components = Components.of(cfg)
    task = build_task(cfg, components)
    check_fits(checkpoint["model"], cfg, components, task, args)
    checkpoint["task_fingerprint"] = task.fingerprint()
    updates = num_updates(state)
    with atomic_open(args.output) as f:
        torch.save(checkpoint, f)
    weights = sum(t.numel() for t in checkpoint["model"].values() if t.is_floating_point())
    logger.info(f"wrote {args.output}: fairseq transformer_lm ({weights / 1e6:.1f}M weights, "
                f"{len(task.source_dictionary)} symbols"
                + (f", {updates} updates" if updates is not None else "") + ")")
    return args.output


def not_fairseq(state, path: str) -> str:
    """Why a file that torch loads is refused: ours needs no import; anything else is named as what it is not."""
    if isinstance(state, dict) and "model" in state and "cfg" in state:
        return (f"{path} is not a fairseq checkpoint but a shardtrain one: it needs no import; pass it to --path "
                "directly.")
    if isinstance(state, dict):
        what = f"a dict with the keys {sorted(map(str, state))[:5]}"
    else:
        what = f"a {type(state).__name__}"
    return (f"{path} is not a fairseq checkpoint: it holds {what}, and neither the args, cfg or "
            "optimizer_history entries of a fairseq checkpoint nor the model and cfg of a shardtrain one. Pass "
            "the checkpoint fairseq-train wrote (checkpoint_best.pt, checkpoint_last.pt, ...).")


def num_updates(state):
    """fairseq's update count, for the log (None when the history is absent or not fairseq's shape)."""
    history = state.get("optimizer_history")
    last = history[-1] if isinstance(history, list) and history else None
    return last.get("num_updates") if isinstance(last, dict) else None


def check_fits(weights, cfg, components: Components, task, args) -> None:
    """The converted weights must be exactly what a model built from the converted
    config holds (built on the meta device: no memory, no initialisation cost)."""
    embed, symbols = weights.get("embed_tokens.weight"), len(task.source_dictionary)
    rows = symbols if embed is None else embed.size(0)  # a missing table is reported below as missing
    if rows != symbols:
        raise CheckpointError(
            f"{args.input} embeds {rows} symbols but {args.data}/dict.txt gives {symbols}: the model was trained "
            "with another dictionary. Pass the data-bin fairseq-train used (--data).")
    with torch.device("meta"):
        model = build_model(cfg, components, task)
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
