"""The training step: accumulation, clipping, NaN detection (no processes needed)."""
import math

import pytest
import torch

from shardtrain.data.collate import collate
from shardtrain.trainer.trainer import TrainingDivergedError
from small_trainer import blocks, data_bin, make_trainer, params  # noqa: F401 (data_bin is a fixture)


def test_accumulation_equals_one_big_batch(data_bin):
    """--update-freq 2 over batches A, B == one update on A+B (the loss is normalised by total tokens)."""
    a, task = make_trainer(data_bin)
    b, _ = make_trainer(data_bin)
    samples = blocks(task, range(8))
    pad = task.dictionary.pad()
    a.train_step([collate(samples[:3], pad), collate(samples[3:], pad)])  # uneven split on purpose
    b.train_step([collate(samples, pad)])
    for pa, pb in zip(params(a), params(b)):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


@pytest.mark.flag_effect("--clip-norm")
def test_gnorm_is_the_true_norm_and_clipping_scales_to_clip_norm(data_bin):
    trainer, task = make_trainer(data_bin, "--clip-norm", "0.01")
    batch = collate(blocks(task, range(4)), task.dictionary.pad())
    # the gradient the update will use, computed by hand with the same normalisation
    ref, _ = make_trainer(data_bin)
    loss, sample_size, _ = ref.criterion(ref.model, batch)
    (loss / sample_size).backward()
    expected = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in ref.model.parameters() if p.grad is not None))
    before = params(trainer)
    out = trainer.train_step([batch])
    assert out["gnorm"] == pytest.approx(expected, rel=1e-5)
    assert out["clip"] == 1.0 and expected > 0.01
    step = math.sqrt(sum(float((p1 - p0).pow(2).sum()) for p0, p1 in zip(before, params(trainer))))
    assert step == pytest.approx(0.1 * 0.01, rel=1e-3)  # sgd: lr * clipped norm


def test_nan_loss_stops_naming_the_update_and_leaves_weights_intact(data_bin):
    trainer, task = make_trainer(data_bin)
    batch = collate(blocks(task, range(4)), task.dictionary.pad())
    trainer.train_step([batch])
    with torch.no_grad():
        next(trainer.model.blocks[0].parameters()).view(-1)[0] = float("nan")
    before = params(trainer)
    with pytest.raises(TrainingDivergedError, match="at update 2"):
        trainer.train_step([batch])
    for p0, p1 in zip(before, params(trainer)):
        assert torch.equal(p0.nan_to_num(), p1.nan_to_num())
    assert trainer.num_updates == 1
