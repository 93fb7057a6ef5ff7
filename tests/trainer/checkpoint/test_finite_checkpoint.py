"""No checkpoint with NaN/inf weights or optimizer state is ever written, and a divergence
only calls a checkpoint intact when this run checked it (red-team item 1 of issue 16)."""
import os
import subprocess
import sys

import pytest
import torch

from shardtrain.core.errors import CheckpointError
from shardtrain.trainer.checkpoint.finite import check_finite
from shardtrain.trainer.precision.component import Precision
from shardtrain.trainer.precision.diverged import TrainingDivergedError
from shardtrain.config.run_config import parse_train_args
from shardtrain.data.collate import collate
from shardtrain.trainer.launch.start import call_main
from finite_mains import refusals_when_one_rank_is_damaged
from st_testutils import last_checkpoint_state, make_space_data_bin, tiny_model_flags
from small_trainer import blocks, make_trainer

FLIP_PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flip_plugin")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("finite")), n_words=8, train_tokens=6000,
                               valid_tokens=200, line_len=40)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.parametrize("ranks,backend", [(1, "pytorch_ddp"), (2, "fully_sharded")])
def test_nan_weights_are_never_saved(data, tmp_path, ranks, backend):
    """The red team's case: one sign bit of exp_avg_sq flipped; update 5 steps to NaN weights
    with a finite gradient. On 2 ranks only rank 1's shard is damaged: both refuse together."""
    save = tmp_path / "ck"
    result = subprocess.run(
        [sys.executable, "-m", "shardtrain.cli.train", data, *tiny_model_flags(), "--cpu", "--save-dir", str(save),
         "--disable-validation", "--max-update", "8", "--save-interval-updates", "1", "--user-dir", FLIP_PLUGIN,
         "--optimizer", "flip_adam", "--lr", "1e-3", "--flip-at-update", "5", "--flip-rank", str(ranks - 1),
         "--distributed-world-size", str(ranks), "--ddp-backend", backend],
        capture_output=True, text=True, timeout=240)
    err = result.stderr.replace("\n", " ")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Not saving the checkpoint of update 5: the model's parameters hold NaN or inf" in err, err[-3000:]
    assert f"(first on rank {ranks - 1}" in err and "Traceback" not in result.stderr + result.stdout
    assert last_checkpoint_state(save)["train_state"]["num_updates"] == 4
    assert not [p for p in os.listdir(save) if "_5" in p or "_6" in p], os.listdir(save)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
def test_every_rank_refuses_when_one_ranks_shard_is_damaged(data, tmp_path):
    """Under fully_sharded each rank holds only its own shard: rank 0's are finite, yet it
    must refuse with rank 1 (or it would enter the save's collectives alone)."""
    cfg = parse_train_args([data, *tiny_model_flags(), "--cpu", "--save-dir", str(tmp_path / "ck"),
                            "--distributed-world-size", "2", "--ddp-backend", "fully_sharded"])
    outcomes = call_main(cfg, refusals_when_one_rank_is_damaged)
    assert [o[0] for o in outcomes] == [None, None]
    for text in (o[1] for o in outcomes):
        assert text and "update 7: the model's parameters hold NaN or inf (first on rank 1" in text, outcomes


def test_check_names_the_damaged_part(data):
    trainer, task = make_trainer(data, "--optimizer", "adam")
    trainer.train_step([collate(blocks(task, range(4)), task.dictionary.pad())])
    check_finite(trainer.model, trainer.optimizer, trainer.backend, 1)  # finite: no refusal
    param = next(trainer.model.parameters())
    trainer.optimizer.state[param]["exp_avg_sq"].view(-1)[3] = float("inf")
    with pytest.raises(CheckpointError, match=r"update 1: the model's optimizer state hold NaN or inf "
                                              r"\(first on rank 0: '.*\.exp_avg_sq'\)"):
        check_finite(trainer.model, trainer.optimizer, trainer.backend, 1)
    trainer.optimizer.state[param]["exp_avg_sq"].view(-1)[3] = 1.0
    with torch.no_grad():
        list(trainer.model.parameters())[-1].view(-1)[0] = float("nan")
    with pytest.raises(CheckpointError, match=r"the model's parameters hold NaN or inf"):
        check_finite(trainer.model, trainer.optimizer, trainer.backend, 1)


def test_divergence_calls_a_checkpoint_intact_only_when_checked():
    precision = Precision()
    with pytest.raises(TrainingDivergedError) as info:
        precision.accept(torch.tensor(float("nan")), 6)
    assert "intact" not in str(info.value) and "saved no checkpoint yet" in str(info.value)
    # the loop names the checkpoint manager's newest checked save as the error passes (loop.train_or_skip)
    named = str(info.value.naming("checkpoint_1_4.pt of update 4"))
    assert "the last checkpoint this run saved, checkpoint_1_4.pt of update 4, was checked finite" in named
    assert named.startswith("The loss or gradient is NaN/inf at update 6; stopping before the weights are corrupted")
    assert "saved no checkpoint yet" not in named


def test_finite_values_whose_norm_overflows_still_pass():
    """Adam's exp_avg_sq may legitimately hold 1e30; fp16 moments' norms pass 65504. Neither is NaN."""
    from shardtrain.trainer.checkpoint.finite import all_finite

    large = [torch.full((64,), 1e30), torch.full((4096,), 60000.0, dtype=torch.float16), torch.randn(8)]
    assert all_finite(large) and all_finite([])
    large[1][7] = float("-inf")
    assert not all_finite(large)
