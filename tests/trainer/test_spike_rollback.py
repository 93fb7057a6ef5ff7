"""--spike-rollback: a poisoned batch on one rank spikes the loss; every rank rolls back to the last
snapshot, skips the batches since, and ends with exactly the weights of a run whose data never held
them (dropout on, so the random generators must be restored too). Without the flag, as before."""
import functools
import math

import pytest
import torch

from shardtrain.config.build import parse_train_args
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.precision import TrainingDivergedError
from shardtrain.trainer.spike import SpikeRule
from st_testutils import make_space_data_bin, tiny_model_flags
import spike_mains  # noqa: E402 - beside this file

POISON = 10  # the poisoned update; snapshots every 4 updates: the run rolls back to update 8
FLAGS = ["--max-update", "16", "--lr", "0.01", "--lr-scheduler", "fixed", "--dropout", "0.1", "--no-save",
         "--disable-validation", "--log-format", "none"]
SPIKE = ["--spike-rollback", "--spike-window", "4", "--spike-snapshot-interval", "4", "--spike-factor", "1.5"]
BACKENDS = {"one_process": [], "pytorch_ddp": ["--distributed-world-size", "2"],
            "fully_sharded": ["--distributed-world-size", "2", "--ddp-backend", "fully_sharded"]}


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("spike")), n_words=8, train_tokens=20000)


def cfg(data_bin, tmp_path, *extra):
    return parse_train_args([data_bin, *tiny_model_flags(), *FLAGS, "--save-dir", str(tmp_path / "ck"), *extra])


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_rolled_back_spike_ends_as_if_its_batches_were_never_there(data_bin, tmp_path, backend):
    weights, losses, rollbacks, updates = call_main(cfg(data_bin, tmp_path, *SPIKE, *BACKENDS[backend]),
                                                    functools.partial(spike_mains.poisoned, poison_call=POISON))
    assert rollbacks == [POISON] and updates == 16
    assert losses[POISON - 1] > 1.5 * max(losses[POISON - 3:POISON - 1])  # it did spike
    reference, ref_updates = call_main(cfg(data_bin, tmp_path, *BACKENDS[backend]),
                                       functools.partial(spike_mains.skipping, skip_calls={POISON - 1, POISON}))
    assert ref_updates == 16 and reference.keys() == weights.keys()
    for name, tensor in reference.items():
        assert torch.equal(weights[name], tensor), name  # bit for bit: the skip is exact


def test_without_the_flag_the_poisoned_update_is_trained_on(data_bin, tmp_path):
    weights, losses, rollbacks, updates = call_main(cfg(data_bin, tmp_path),
                                                    functools.partial(spike_mains.poisoned, poison_call=POISON))
    reference, _ = call_main(cfg(data_bin, tmp_path),
                             functools.partial(spike_mains.skipping, skip_calls={POISON - 1, POISON}))
    assert rollbacks == [] and updates == 16 and len(losses) == 16
    assert any(not torch.equal(weights[k], reference[k]) for k in reference)


def test_the_rule():
    rule = SpikeRule(factor=2.0, window=3)
    assert [rule.judge(x) for x in (5.0, 4.0, 3.0)] == [None] * 3  # the history fills before anything is judged
    assert rule.judge(8.5) is not None and rule.judge(7.9) is None  # above / below 2 x the median (4.0)
    assert "nan" in rule.judge(math.nan) and "inf" in rule.judge(math.inf)


def test_too_many_rollbacks_stop_the_run(data_bin, tmp_path):
    with pytest.raises(TrainingDivergedError, match="--spike-max-rollbacks 0"):
        call_main(cfg(data_bin, tmp_path, *SPIKE, "--spike-max-rollbacks", "0"),
                  functools.partial(spike_mains.poisoned, poison_call=POISON))


def test_a_sharded_checkpoint_after_a_rollback_resumes_exactly(data_bin, tmp_path):
    """2 fully_sharded ranks: stopped at update 12 (after the rollback at 10) and resumed to 16 from the
    sharded checkpoint_last, the weights are the uninterrupted run's (the skip, the guard's history and
    the data position all saved)."""
    two = ["--distributed-world-size", "2", "--ddp-backend", "fully_sharded"]
    saving = [f for f in FLAGS if f != "--no-save"] + ["--no-epoch-checkpoints"]

    def run(save_dir, max_update, poison_call):
        args = [data_bin, *tiny_model_flags(), *saving, *SPIKE, *two, "--save-dir", str(save_dir),
                "--max-update", str(max_update)]
        return call_main(parse_train_args(args), functools.partial(spike_mains.poisoned, poison_call=poison_call))

    whole, _, rollbacks, _ = run(tmp_path / "whole", 16, POISON)
    assert rollbacks == [POISON]
    run(tmp_path / "stopped", 12, POISON)
    resumed, _, resumed_rollbacks, updates = run(tmp_path / "stopped", 16, 0)  # poisons nothing after the resume
    assert updates == 16 and resumed_rollbacks == [POISON]  # the guard's record came back with the checkpoint
    for name, tensor in whole.items():
        assert torch.equal(resumed[name], tensor), name
