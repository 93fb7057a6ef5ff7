"""A backend and an optimizer from a --user-dir plugin are used by shard-train and planned by shard-plan and
the pre-launch memory check, from the facts on their own class and spec, with no other edit (issue 30).

The model: transformer_lm, 1 layer, width 8, ffn 16, 16 symbols, --tokens-per-sample 16: 856 parameters
(tests/trainer/memory/test_spike_snapshot_memory.py counts them). The plugin's optimizer keeps an fp32 momentum and
an fp16 copy of the gradient: 6 x 856 = 5,136 bytes of state; its spec says 6 bytes and that it steps in CPU
memory. The plugin's backend says it keeps two copies of every fp32 gradient (2 x 4 x 856 = 6,848 bytes)
and sends 3 x 4 bytes per parameter per update (10,272)."""
import json
import os
import subprocess
import sys

import pytest

from st_testutils import make_space_data_bin

TESTS_ROOM = "shardtrain.core"  # it drives the commands: its imports cannot say which room it tests

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

PLUGIN = os.path.join(os.path.dirname(__file__), "facts_plugin")
MODEL = ["--arch", "transformer_lm", "--decoder-layers", "1", "--decoder-embed-dim", "8",
         "--decoder-ffn-embed-dim", "16", "--decoder-attention-heads", "2", "--tokens-per-sample", "16"]
COUNT = 856
# In a subprocess: the plugin's backend and optimizer must not stay registered in this test process.
SCRIPT = """
import json, sys
from shardtrain.cli import plan, train
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.run_facts import run_facts
from shardtrain.trainer.memory.fit import estimate
from shardtrain.trainer.resolved import Components, build_task

flags, save_dir = sys.argv[1:-1], sys.argv[-1]
train.main(flags + ["--batch-size", "4", "--max-update", "3", "--no-save", "--disable-validation",
                    "--log-format", "none", "--save-dir", save_dir])
used = dict(sys.modules["facts_plugin"].USED)
cfg = parse_train_args(flags)
components = Components.of(cfg)
fit = estimate(cfg, components, build_task(cfg, components), run_facts(cfg, components, 1, 1), "cpu", activations=False)
planned = plan.main(flags + ["--distributed-world-size", "2", "--gpu-memory", "80", "--peak-tflops", "100",
                             "--host-memory", "100"])
gpu = planned.given.estimate
print("FIGURES " + json.dumps({"used": used, "fit_optimizer": fit.optimizer, "plan_optimizer": gpu.optimizer,
                              "extra": gpu.extra, "comm": gpu.comm_bytes, "host": gpu.host_peak,
                              "offload": gpu.offload_bytes,
                              "labels": [p.option.label for p in planned.options], "traced_wraps": sys.modules["facts_plugin"].USED["wrapped"]}))
"""


def test_a_plugin_backend_and_optimizer_train_and_are_planned_from_their_own_facts(tmp_path):
    data = make_space_data_bin(str(tmp_path / "data"), n_words=8, train_tokens=2000)
    flags = [data, "--user-dir", PLUGIN, *MODEL, "--ddp-backend", "toy_dp", "--optimizer", "toy_momentum", "--cpu"]
    result = subprocess.run([sys.executable, "-c", SCRIPT, *flags, str(tmp_path / "ck")], capture_output=True,
                            text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("FIGURES ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    got = json.loads(lines[0][len("FIGURES "):])
    assert got["used"] == {"wrapped": 1, "steps": 3}  # shard-train wrapped with the toy backend, stepped the toy
    assert got["traced_wraps"] > 1  # shard-plan's trace prepared the model with the toy backend too
    assert got["fit_optimizer"] == 6 * COUNT  # the memory check: the spec's state_bytes
    assert got["plan_optimizer"] == 6 * COUNT  # shard-plan: what the toy optimizer's step created
    assert got["extra"] == 2 * 4 * COUNT  # the backend's two gradient copies
    assert got["comm"] == 3 * 4 * COUNT  # the bytes the backend says it sends
    assert got["host"] == 6 * COUNT  # it steps in CPU memory: its state is in host memory on a GPU run
    assert got["offload"] == 2 * 4 * COUNT  # the gradients to the host and the parameters back
    # the toy backend's own plan_variants: shard-plan weighs it beside the built-ins, with every planned precision
    assert {"toy_dp, fp32", "toy_dp, bf16", "toy_dp, fp16", "toy_dp, fp32, checkpointed"} <= set(got["labels"])
