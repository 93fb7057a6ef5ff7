"""The CPU step during backward on a GPU (issue 39): under --cpu-offload the worker waits for each gradient's copy
to the host (an event on the reduce stream) and steps it while the GPU goes on with backward; the weights and Adam
state equal the synchronous step's bit for bit, with clipping that never fires and with clipping on every update
(undo and redo), and each record splits the update (trainer/offload_times.py)."""
import pytest
import torch
from torch.distributed.tensor import DTensor

import gpu_runs
from conftest import needs_gpus
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.loop import Run

UPDATES = 4


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def _train(data, tmp_path, when, clip):
    cfg = parse_train_args([data, *gpu_runs.MODEL, "--ddp-backend", "fully_sharded", "--cpu-offload", "--bf16",
                            "--optimizer", "cpu_adam", "--cpu-step", when, "--clip-norm", clip, "--no-save",
                            "--save-dir", str(tmp_path / when), "--max-update", str(UPDATES), "--seed", "3"])
    run = Run(cfg, make_context(0, 0, 1, use_cuda=True, backend=None))
    try:
        trainer = run.trainer
        assert (trainer.step_in_backward is not None) == (when == "during-backward")
        itr = run.batch_iterator(cfg.dataset.train_subset, epoch=1, shuffle=False).next_epoch_itr(shuffle=False)
        batches = iter(itr)
        outs = []
        for _ in range(UPDATES):
            batch = next(batches)
            trainer.set_dummy_batch(batch)
            outs.append(trainer.train_step([batch]))
        state = [_local(p).detach().cpu().clone() for p in trainer.params]
        for p in trainer.params:
            s = trainer.optimizer.state[p]
            state += [_local(s[k]).detach().cpu().clone() for k in ("exp_avg", "exp_avg_sq", "step")]
        return outs, state
    finally:
        run.close()


@needs_gpus(1)
@pytest.mark.parametrize("clip", ["0", "1e-3"])  # never clipped; clipped on every update (undone, stepped again)
def test_stepping_during_backward_on_a_gpu_equals_stepping_after_it(tmp_path, clip):
    data = gpu_runs.data_bin(tmp_path / "data")
    during, after = (_train(data, tmp_path, when, clip) for when in ("during-backward", "after-backward"))
    assert [o["gnorm"] for o in during[0]] == [o["gnorm"] for o in after[0]]
    assert [o["clip"] for o in during[0]] == [float(clip != "0")] * UPDATES
    assert all(torch.equal(a, b) for a, b in zip(during[1], after[1]))
    for out in during[0][1:]:  # the first update creates Adam's state
        split = out["offload"]
        assert split["offload_grad_wait"] >= 0 and split["offload_cpu_step"] > 0
        assert split["offload_hidden"] > 0, split
    assert all(o["offload"]["offload_hidden"] == 0.0 for o in after[0])
