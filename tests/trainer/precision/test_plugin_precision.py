"""A precision from a --user-dir plugin is one file (tests/trainer/precision/precision_plugin): with no other edit
it is a choice of --precision in shard-train's --help, an alternative shard-plan weighs and prints as a flag, and
what a 1-update run trains with (issue 40, item 2)."""
import json
import os
import subprocess
import sys

import pytest

from st_testutils import make_space_data_bin

TESTS_ROOM = "shardtrain.trainer.precision"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # a training run, in a process of its own

PLUGIN = os.path.join(os.path.dirname(__file__), "precision_plugin")
MODEL = ["--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "8",
         "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2", "--tokens-per-sample", "16"]
# In a subprocess: the plugin's precision must not stay registered in this test process.
SCRIPT = """
import contextlib, io, json, sys
from shardtrain.cli import plan, train
from shardtrain.plan.options import flags_to_add

flags, save_dir = sys.argv[1:-1], sys.argv[-1]
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        train.main(flags + ["--help"])
    except SystemExit:
        pass
planned = plan.main(flags + ["--distributed-world-size", "2", "--host-memory", "100"])
toy = [p for p in planned.options if "toy_fixed_scale" in p.option.label]
used = sys.modules["precision_plugin"].USED
traced = dict(used)
used.update(built=0, backward=0, steps=0)
train.main(flags + ["--precision", "toy_fixed_scale", "--batch-size", "4", "--max-update", "1", "--no-save",
                    "--disable-validation", "--log-format", "none", "--save-dir", save_dir])
print("FIGURES " + json.dumps({"help": out.getvalue(), "labels": [p.option.label for p in toy],
                              "flags": flags_to_add(planned.given.cfg, toy[0].option) if toy else [],
                              "traced": traced, "used": dict(used)}))
"""


def test_a_plugin_precision_is_in_help_in_shard_plans_options_and_trains(tmp_path):
    data = make_space_data_bin(str(tmp_path / "data"), n_words=8, train_tokens=2000)
    flags = [data, "--user-dir", PLUGIN, *MODEL, "--optimizer", "sgd", "--cpu"]  # sgd: no --fp16-adam-stats options
    result = subprocess.run([sys.executable, "-c", SCRIPT, *flags, str(tmp_path / "ck")], capture_output=True,
                            text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("FIGURES ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    got = json.loads(lines[0][len("FIGURES "):])
    help_text = " ".join(got["help"].split())  # argparse wraps the choices over lines
    assert "--precision {fp32,bf16,fp16,memory_efficient_bf16,memory_efficient_fp16,toy_fixed_scale}" in help_text
    # shard-plan weighs it beside fp32, bf16 and fp16, for every backend and checkpointing choice: 3 backends
    # on 2 ranks of one node (pytorch_ddp, with zero os, fully_sharded) x checkpointing on and off
    assert sorted(got["labels"]) == sorted([
        "pytorch_ddp, toy_fixed_scale", "pytorch_ddp, toy_fixed_scale, checkpointed",
        "pytorch_ddp + zero os, toy_fixed_scale", "pytorch_ddp + zero os, toy_fixed_scale, checkpointed",
        "fully_sharded, toy_fixed_scale", "fully_sharded, toy_fixed_scale, checkpointed"])
    assert "--precision toy_fixed_scale" in got["flags"]  # printed as the flag that picks it
    assert got["traced"]["built"] >= 1 and got["traced"]["backward"] >= 2  # its step traced: two updates a trace
    # the run built it once and backpropagated and stepped through it once
    assert got["used"] == {"built": 1, "backward": 1, "steps": 1}
