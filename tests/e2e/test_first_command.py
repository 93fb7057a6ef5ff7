"""The command users type first starts sensible training with nothing else given."""
import shutil
import subprocess

import pytest
import torch

from st_testutils import last_checkpoint_state, make_space_data_bin

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run


def test_fully_sharded_cpu_offload_with_defaults_only(tmp_path):
    # One sample of the default --tokens-per-sample 1024 and one update: the default model (19M parameters)
    # makes every token and update cost; what is checked is what the defaults build, not how it learns.
    make_space_data_bin(str(tmp_path), n_words=50, train_tokens=700, valid_tokens=120, line_len=60)
    command = [shutil.which("shard-train") or "shard-train", "data-bin", "--ddp-backend", "fully_sharded",
               "--cpu-offload", "--max-update", "1"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout
    assert "optimizer: AdamW (fused) stepping on cpu" in log  # adam on the CPU shards, fused kernel
    assert "fully_sharded: materialised this rank's shards" in log
    assert (tmp_path / "checkpoints" / "checkpoint_last" / "COMPLETE").exists()  # fully_sharded: a sharded directory
    state = last_checkpoint_state(tmp_path / "checkpoints")
    cfg = state["cfg"]
    assert (cfg["components"]["task"], cfg["components"]["arch"], cfg["components"]["criterion"]) == \
        ("language_modeling", "transformer_lm", "cross_entropy")
    assert cfg["components"]["lr_scheduler"] == "inverse_sqrt" and state["train_state"]["num_updates"] == 1
    assert state["train_iterator"]["num_shards"] == (torch.cuda.device_count() or 1)  # all GPUs, or 1 process
    # Nothing on stderr but the line a slow import prints within its first second (cli/entry.py).
    assert result.stderr in ("", "shard-train: starting (importing torch and the components)...\n"), result.stderr
