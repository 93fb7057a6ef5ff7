"""Running shard-train on the visible GPUs, for the GPU acceptance cases.

Each run is a subprocess (a fresh CUDA context and clean process groups),
with the JSON log records read back."""
import os
import subprocess
import sys

from st_testutils import json_records, make_space_data_bin

MODEL = ["--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "64",
         "--decoder-ffn-embed-dim", "128", "--decoder-attention-heads", "4", "--tokens-per-sample", "64",
         "--batch-size", "8", "--required-batch-size-multiple", "1"]


def data_bin(directory) -> str:
    return make_space_data_bin(str(directory), n_words=64, train_tokens=40000, valid_tokens=2000, line_len=60)


def train(data, save_dir, *flags, timeout=900):
    """Train on the GPUs (no --cpu); returns (train_inner records, valid records). Fails with the log."""
    save_dir = str(save_dir)
    log = save_dir + ".log"
    argv = [sys.executable, "-m", "shardtrain.cli.train", data, *MODEL, "--save-dir", save_dir, "--log-file", log,
            "--log-format", "json", "--log-interval", "1", *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    assert done.returncode == 0, f"{' '.join(argv)}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return json_records(log, "train_inner"), json_records(log, "valid")
