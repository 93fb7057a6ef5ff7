"""Tiny in-process runs for the keep-policy and validation-schedule tests, and what they leave behind:
the names in --save-dir, the updates at which checkpoints were saved, and those validated at.

One --cpu process is enough for both checkpoint formats: --ddp-backend fully_sharded writes sharded
directories with one rank too (the format follows the backend, not the world size)."""
import os
import re

from shardtrain.cli import train
from st_testutils import MarkovChain, json_records, tiny_model_flags, write_markov_corpus

# 512 training tokens: 17 blocks of 32 in batches of 8 -> updates of 8, 8 and 1 sequences, so epoch E ends
# at update 3 * E (the tests check this from the train records)
UPDATES_PER_EPOCH = 3
BOOKKEEPING = {".shardtrain.lock", "config.yaml"}  # not checkpoints
SAVED = re.compile(r"saved checkpoint (?!- )\S+ \(epoch \d+ @ (\d+) updates")  # "-": nothing was named


def short_epochs_data_bin(directory: str) -> str:
    """A data-bin of short epochs, with a second validation split, ``test`` (the training text)."""
    from shardtrain.cli import preprocess

    text = write_markov_corpus(os.path.join(directory, "text"), MarkovChain(n=8), 512, 128, line_len=40)
    dest = os.path.join(directory, "data-bin")
    preprocess.main(["--tokenizer", "space", "--trainpref", text["train"], "--validpref", text["valid"],
                     "--testpref", text["train"], "--destdir", dest, "--no-progress-bar"])
    return dest


def run(data_bin: str, tmp_path, name: str, *flags: str, backend: str = "pytorch_ddp", save_as: str = "") -> dict:
    """Train in this process; return what it left: ``names`` (the save dir's entries, links included,
    bookkeeping files left out; None when there is no save dir), ``saved`` and ``validated`` (the
    updates at which a checkpoint was written / validation ran, in order) and ``epoch_ends``.
    ``save_as``: the save dir of an earlier run's ``name``, to relaunch it (the log is this run's own)."""
    save, log = tmp_path / f"{save_as or name}-ck", str(tmp_path / f"{name}.log")
    train.main([data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", backend, "--save-dir", str(save),
                "--log-file", log, "--lr", "1e-3", "--warmup-updates", "1", *flags])
    with open(log) as f:
        saved = [int(m.group(1)) for m in SAVED.finditer(f.read())]
    return {
        "names": set(os.listdir(save)) - BOOKKEEPING if save.exists() else None,
        "saved": saved,
        "validated": [int(r["valid_num_updates"]) for r in json_records(log, "valid")],
        "valid_losses": [r["valid_loss"] for r in json_records(log, "valid")],
        "epoch_ends": [int(r["train_num_updates"]) for r in json_records(log, "train")],
        "save_dir": save,
        "log": log,
    }


def link_targets(save_dir) -> dict:
    """{link name: the name it points to} for the sharded format's aliases."""
    return {n: os.readlink(save_dir / n) for n in os.listdir(save_dir) if os.path.islink(save_dir / n)}
