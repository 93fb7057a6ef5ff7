"""The CPU step during backward on a GPU (issue 39): under --cpu-offload the worker waits for each gradient's copy
to the host (an event on the reduce stream) and steps it while the GPU goes on with backward; the weights and Adam
state equal the synchronous step's bit for bit, with clipping that never fires and with clipping on every update
(undo and redo), and each record splits the update (trainer/offload_times.py).

The model is too small for a copy still to be in flight when the worker reads its gradient, so the reduce stream
is held back (DELAY_S before each gradient's copy, issue 45, 2.10): where torch copies the gradient to the host
without blocking although a hook reads it (torch 2.11), the worker must wait for the copy's event, and a worker that
did not would step garbage (the bitwise comparison fails) and wait for nothing (offload_grad_wait fails). Where the
copy blocks the training thread (torch 2.13 checks for the hook), the event is complete when the worker reads it:
the worker's wait is near 0, and that is asserted instead.
"""
import inspect

import pytest
import torch
from torch.distributed.fsdp._fully_shard import _fsdp_collectives
from torch.distributed.tensor import DTensor

import gpu_runs
from conftest import needs_gpus
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.loop import Run

UPDATES = 4
DELAY_S = 0.025  # on the reduce stream, at each of FSDP2's two _div_if_needed calls of a reduce: 3 reduces a backward
# torch 2.13's foreach_reduce copies a gradient synchronously where a post-accumulate-grad hook reads it; 2.11 does not
COPY_BLOCKS = "has_post_acc_grad_hook" in inspect.getsource(_fsdp_collectives.foreach_reduce)


def _sleep_cycles(seconds: float) -> int:
    """GPU clock cycles torch.cuda._sleep spins for ``seconds`` (timed on this GPU, not read from a data sheet)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10 ** 7
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return int(cycles * seconds / (start.elapsed_time(end) / 1000))


def _delay_the_reduce_stream(monkeypatch) -> None:
    """Each gradient's copy to the host waits DELAY_S more on FSDP2's reduce stream (the current stream there)."""
    real, cycles = _fsdp_collectives._div_if_needed, _sleep_cycles(DELAY_S)

    def delayed(tensor, div_factor):
        torch.cuda._sleep(cycles)
        return real(tensor, div_factor)
    monkeypatch.setattr(_fsdp_collectives, "_div_if_needed", delayed)


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
def test_stepping_during_backward_on_a_gpu_equals_stepping_after_it(tmp_path, monkeypatch, clip):
    data = gpu_runs.data_bin(tmp_path / "data")
    _delay_the_reduce_stream(monkeypatch)
    during, after = (_train(data, tmp_path, when, clip) for when in ("during-backward", "after-backward"))
    assert [o["gnorm"] for o in during[0]] == [o["gnorm"] for o in after[0]]
    assert [o["clip"] for o in during[0]] == [float(clip != "0")] * UPDATES
    assert all(torch.equal(a, b) for a, b in zip(during[1], after[1]))
    for out in during[0][1:]:  # the first update creates Adam's state
        split = out["offload"]
        # non-blocking copies: the first block's gradient lands >= 2 x DELAY_S after its hook ran; blocking ones:
        # the training thread waited for it, the worker does not
        if COPY_BLOCKS:
            assert split["offload_grad_wait"] < DELAY_S, split
        else:
            assert split["offload_grad_wait"] >= DELAY_S, split
        assert split["offload_cpu_step"] > 0 and split["offload_hidden"] > 0, split
    for out in after[0][1:]:
        split = out["offload"]
        # the whole step lies after backward: a split that marked backward's end late, or lost the step's stretch
        # on the training thread, fails it
        assert split["offload_step_exposed"] >= split["offload_cpu_step"] > 0, split
