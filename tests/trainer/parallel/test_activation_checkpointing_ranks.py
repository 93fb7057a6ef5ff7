"""Activation checkpointing composes with every multi-rank backend (2 real gloo ranks on CPU):
the same losses and weights as without it, and under fully_sharded each FSDP unit wraps a
checkpointed block."""
import numpy as np
import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from ac_mains import VARIANTS, train_variants
from st_testutils import make_space_data_bin

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]

UPDATES, LAYERS = 4, 3


def test_checkpointing_equals_no_checkpointing_on_two_ranks(tmp_path):
    data_bin = make_space_data_bin(str(tmp_path / "data"), train_tokens=1500, valid_tokens=200)
    cfg = parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", str(LAYERS), "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--batch-size", "4", "--required-batch-size-multiple", "1",
        # dropout on: the recomputation must redraw the same masks
        "--dropout", "0.1", "--attention-dropout", "0.1", "--activation-dropout", "0.1",
        "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.5", "--max-update", str(UPDATES),
        "--no-save", "--disable-validation", "--cpu", "--threads", "1", "--log-format", "none",
        "--save-dir", str(tmp_path / "unused"), "--distributed-world-size", "2", "--heartbeat-timeout", "60"])
    results = call_main(cfg, train_variants)
    assert results.keys() == VARIANTS.keys()

    every_block, every_second = [True] * LAYERS, [False, True, False]
    expected_layout = {
        "fully_sharded": [(True, False)] * LAYERS,
        "fully_sharded+ac": [(True, True)] * LAYERS,  # each FSDP unit is a checkpointed block
        "fully_sharded+offload/2": [(True, c) for c in every_second],
        "pytorch_ddp": [(False, False)] * LAYERS, "pytorch_ddp+ac": [(False, c) for c in every_block],
        "legacy_ddp": [(False, False)] * LAYERS, "legacy_ddp+ac": [(False, c) for c in every_block],
    }
    for name, (losses, _, layout) in results.items():
        assert layout == expected_layout[name], name
        assert len(losses) == UPDATES and np.all(np.isfinite(losses)), name
    for name in VARIANTS:
        reference = results[name.split("+")[0]]
        losses, weights, _ = results[name]
        np.testing.assert_allclose(losses, reference[0], rtol=1e-6, atol=1e-6, err_msg=name)
        assert weights.keys() == reference[1].keys()
        for key in weights:
            np.testing.assert_allclose(weights[key], reference[1][key], rtol=1e-6, atol=1e-6,
                                       err_msg=f"{name}: {key}")
    # the updates moved the weights (otherwise equal weights would prove nothing)
    first = results["pytorch_ddp"]
    assert first[0][0] != first[0][-1]
