"""--spike-rollback: a poisoned batch on one rank spikes the loss; every rank rolls back to the last
snapshot, skips the batches since, and ends with exactly the weights of a run whose data never held
them (dropout on, so the random generators must be restored too). Without the flag, as before.

Every 2-rank run of the file shares one spawn (``two_rank_runs``); the 1-rank runs train in this process."""
import functools
import math

import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.data.batch_windows import format_windows
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.precision.diverged import TrainingDivergedError
from shardtrain.trainer.spike import SpikeRule
from st_testutils import make_space_data_bin, tiny_model_flags
from one_spawn import call_each
import spike_mains  # noqa: E402 - beside this file

POISON = 10  # the poisoned update; snapshots every 4 updates: the run rolls back to update 8
WINDOW = [(1, POISON - 1, POISON)]  # the batches of updates 9 and 10 (one batch each)
FLAGS = ["--max-update", "16", "--lr", "0.01", "--lr-scheduler", "fixed", "--dropout", "0.1", "--no-save",
         "--disable-validation", "--log-format", "none"]
SPIKE = ["--spike-rollback", "--spike-window", "4", "--spike-snapshot-interval", "4", "--spike-factor", "1.5"]
BACKENDS = {"one_process": [], "pytorch_ddp": ["--distributed-world-size", "2"],
            "fully_sharded": ["--distributed-world-size", "2", "--ddp-backend", "fully_sharded"],
            "legacy_ddp": ["--distributed-world-size", "2", "--ddp-backend", "legacy_ddp"],
            "zero_os_fp16": ["--distributed-world-size", "2", "--zero-sharding", "os", "--fp16"]}
TWO = ["--distributed-world-size", "2", "--ddp-backend", "fully_sharded"]  # the sharded resume's runs
SAVING = [f for f in FLAGS if f != "--no-save"] + ["--no-epoch-checkpoints"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    # 10k tokens: 41 batches of 8 x 32 tokens, so epoch 1 holds all 16 updates on 2 ranks (20) as on 1 (41)
    return make_space_data_bin(str(tmp_path_factory.mktemp("spike")), n_words=8, train_tokens=10000)


def cfg(data_bin, tmp_path, *extra):
    return parse_train_args([data_bin, *tiny_model_flags(), *FLAGS, "--save-dir", str(tmp_path / "ck"), *extra])


def resume_cfg(data_bin, save_dir, max_update):
    return parse_train_args([data_bin, *tiny_model_flags(), *SAVING, *SPIKE, *TWO, "--save-dir", str(save_dir),
                             "--max-update", str(max_update), "--spike-lr-scale", "0.5"])


def poisoned(at):
    return functools.partial(spike_mains.poisoned, poison_call=at)


@pytest.fixture(scope="module")
def two_rank_runs(data_bin, tmp_path_factory):
    """Every 2-rank run of this file, in one spawn: {backend: (spiked, reference)} for each 2-rank backend,
    and "resume": (whole, stopped at 12, resumed to 16) of the sharded resume test."""
    root = tmp_path_factory.mktemp("two_ranks")
    two_rank = [b for b in BACKENDS if BACKENDS[b]]
    jobs = []
    for backend in two_rank:
        jobs += [(poisoned(POISON), cfg(data_bin, root / backend, *SPIKE, *BACKENDS[backend])),
                 (functools.partial(spike_mains.skipping, skip_calls=set()),
                  cfg(data_bin, root / backend, *BACKENDS[backend], "--skip-batches", format_windows(WINDOW)))]
    jobs += [(poisoned(POISON), resume_cfg(data_bin, root / "whole", 16)),
             (poisoned(POISON), resume_cfg(data_bin, root / "stopped", 12)),
             (poisoned(0), resume_cfg(data_bin, root / "stopped", 16))]  # poisons nothing after the resume
    results = call_each(jobs)
    runs = {backend: tuple(results[2 * i:2 * i + 2]) for i, backend in enumerate(two_rank)}
    runs["resume"] = (results[-3], results[-2], results[-1])
    return runs


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--spike-rollback", "--spike-snapshot-interval", "--spike-factor", "--skip-batches")
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_rolled_back_spike_ends_as_if_its_batches_were_never_there(data_bin, tmp_path, backend, request):
    """The reference skips the window the rollback recorded (asserted first), through --skip-batches."""
    if BACKENDS[backend]:
        got, (reference, ref_updates) = request.getfixturevalue("two_rank_runs")[backend]
    else:
        got = call_main(cfg(data_bin, tmp_path, *SPIKE), poisoned(POISON))
        reference, ref_updates = call_main(cfg(data_bin, tmp_path, "--skip-batches", format_windows(WINDOW)),
                                           functools.partial(spike_mains.skipping, skip_calls=set()))
    assert got["rollbacks"] == [POISON] and got["updates"] == 16
    losses = got["losses"]
    assert losses[POISON - 1] > 1.5 * max(losses[POISON - 3:POISON - 1])  # it did spike
    assert got["skipped"] == WINDOW
    assert ref_updates == 16 and reference.keys() == got["weights"].keys()
    for name, tensor in reference.items():
        assert torch.equal(got["weights"][name], tensor), name  # bit for bit: the skip is exact


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--skip-batches")
def test_skip_batches_equals_skipping_those_updates(data_bin, tmp_path):
    """--skip-batches itself, against an oracle that drops the same updates' batches by count."""
    flag, _ = call_main(cfg(data_bin, tmp_path, "--skip-batches", "1:3-4,1:7-7"),
                        functools.partial(spike_mains.skipping, skip_calls=set()))
    oracle, _ = call_main(cfg(data_bin, tmp_path), functools.partial(spike_mains.skipping, skip_calls={3, 4, 7}))
    for name, tensor in oracle.items():
        assert torch.equal(flag[name], tensor), name


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--spike-rollback", "--skip-batches")
def test_a_rollback_never_reaches_back_into_the_previous_epoch(data_bin, tmp_path):
    """A spike early in epoch 2, the interval's snapshot far back in epoch 1: the run rolls back to where
    epoch 2 began (its own snapshot), skips only epoch 2's first batches, and equals their --skip-batches."""
    one_epoch = call_main(cfg(data_bin, tmp_path, "--max-epoch", "1", "--max-update", "0"),
                          functools.partial(spike_mains.skipping, skip_calls=set()))[1]
    spike = [*SPIKE, "--spike-snapshot-interval", "1000", "--max-update", str(one_epoch + 4)]
    got = call_main(cfg(data_bin, tmp_path, *spike), functools.partial(spike_mains.poisoned, poison_call=one_epoch + 2))
    assert got["skipped"] == [(2, 1, 2)] and got["updates"] == one_epoch + 4
    reference, _ = call_main(cfg(data_bin, tmp_path, "--max-update", str(one_epoch + 4), "--skip-batches", "2:1-2"),
                             functools.partial(spike_mains.skipping, skip_calls=set()))
    for name, tensor in reference.items():
        assert torch.equal(got["weights"][name], tensor), name


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
def test_without_the_flag_the_poisoned_update_is_trained_on(data_bin, tmp_path):
    got = call_main(cfg(data_bin, tmp_path), functools.partial(spike_mains.poisoned, poison_call=POISON))
    reference, _ = call_main(cfg(data_bin, tmp_path),
                             functools.partial(spike_mains.skipping, skip_calls={POISON - 1, POISON}))
    assert got["rollbacks"] == [] and got["updates"] == 16 and len(got["losses"]) == 16
    assert any(not torch.equal(got["weights"][k], reference[k]) for k in reference)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--spike-gnorm-factor", "--spike-lr-scale")
def test_the_gradient_norm_rule_and_the_lr_scale(data_bin, tmp_path, caplog):
    """The loss rule off (a factor no loss reaches): the poisoned update's gradient norm spikes alone;
    after the rollback the lr is --spike-lr-scale x the schedule's."""
    got = call_main(cfg(data_bin, tmp_path, *SPIKE, "--spike-factor", "1e9", "--spike-gnorm-factor", "5",
                        "--spike-lr-scale", "0.5"), functools.partial(spike_mains.poisoned, poison_call=POISON))
    assert got["rollbacks"] == [POISON] and got["skipped"] == [(1, POISON - 1, POISON)]
    assert "the gradient norm" in caplog.text and "--spike-gnorm-factor" in caplog.text
    assert got["lr"] == 0.005


def test_the_rule():
    rule = SpikeRule(factor=2.0, window=3)
    assert [rule.judge(x) for x in (5.0, 4.0, 3.0)] == [None] * 3  # the history fills before anything is judged
    assert rule.judge(8.5) is not None and rule.judge(7.9) is None  # above / below 2 x the median (4.0)
    assert "nan" in rule.judge(math.nan) and "inf" in rule.judge(math.inf)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.flag_effect("--spike-max-rollbacks")
def test_too_many_rollbacks_stop_the_run(data_bin, tmp_path):
    with pytest.raises(TrainingDivergedError, match="--spike-max-rollbacks 0"):
        call_main(cfg(data_bin, tmp_path, *SPIKE, "--spike-max-rollbacks", "0"),
                  functools.partial(spike_mains.poisoned, poison_call=POISON))


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
def test_a_sharded_checkpoint_after_a_rollback_resumes_exactly(two_rank_runs):
    """2 fully_sharded ranks: stopped at update 12 (after the rollback at 10) and resumed to 16 from the
    sharded checkpoint_last, the weights are the uninterrupted run's (the skip, the guard's history and
    the data position all saved)."""
    whole, _, resumed = two_rank_runs["resume"]
    assert whole["rollbacks"] == [POISON] and whole["lr"] == 0.005
    # the guard's record and the lr scale came back with the checkpoint
    assert resumed["updates"] == 16 and resumed["rollbacks"] == [POISON] and resumed["lr"] == 0.005
    assert resumed["skipped"] == whole["skipped"] == WINDOW
    for name, tensor in whole["weights"].items():
        assert torch.equal(resumed["weights"][name], tensor), name
