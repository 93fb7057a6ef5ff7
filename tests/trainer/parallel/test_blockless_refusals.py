"""What needs a model's ``blocks`` refuses a model without them (issue 46, item 9) before anything is written: the
--user-dir model with only what docs/plugins.md requires (tests/core/gru_plugin), through shard-train's own main,
is one paragraph, exit 2, and no save directory."""
import os

import pytest

from shardtrain.cli import train
from st_testutils import cli_refusal, small_data_bin

TESTS_ROOM = "shardtrain.trainer.parallel"  # it drives the command: its imports cannot say which room it tests
GRU_PLUGIN = os.path.join(os.path.dirname(__file__), "..", "..", "core", "gru_plugin")


@pytest.mark.parametrize("flags, said", [
    (["--checkpoint-activations"], "--checkpoint-activations checkpoints each of the model's repeated blocks"),
    (["--offload-activations"], "--checkpoint-activations checkpoints each of the model's repeated blocks"),
    # slow (~15 s): before this refusal the GRU's forward runs on the meta device, torch.gru step by step (11.6 s
    # in a profile); the other two refuse first
    pytest.param(["--compile"], "--compile compiles each of the model's repeated blocks", marks=pytest.mark.slow),
])
def test_a_model_without_blocks_is_refused_before_anything_is_written(flags, said, tmp_path, capsys):
    data = small_data_bin(str(tmp_path / "data"))
    save = tmp_path / "ck"
    err = cli_refusal(train.main, [data, "--user-dir", GRU_PLUGIN, "--arch", "gru_lm", *flags, "--cpu",
                                   "--max-update", "1", "--save-dir", str(save)], capsys)[1]
    assert said in err and "GRULM has no `blocks`" in err, err
    assert not save.exists()
