"""Scenario 1's placement claims of the offload recipe on a GPU: after an update, parameter shards
and gradients live in pinned CPU memory (so the copies to and from the GPU are asynchronous), the
optimizer state on the CPU, and buffers (the sinusoidal position table) on the GPU."""
import pytest
import torch
from torch.distributed.tensor import DTensor

import gpu_runs
from conftest import needs_gpus
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.loop import Run


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


@pytest.mark.flag_effect("--cpu-offload")
@needs_gpus(1)
@pytest.mark.parametrize("precision", ["--fp16", "--bf16"])
def test_offload_places_state_on_pinned_cpu_and_buffers_on_the_gpu(tmp_path, precision):
    data = gpu_runs.data_bin(tmp_path / "data")
    cfg = parse_train_args([data, *gpu_runs.MODEL, "--ddp-backend", "fully_sharded", "--cpu-offload", precision,
                            "--optimizer", "cpu_adam", "--checkpoint-activations", "--no-save",
                            # the gradients as optimizer.step sees them: stepping during backward (the default
                            # here) steps outside it, and torch 2.13 (not 2.11) copies a gradient with post-accumulate
                            # hooks synchronously into pageable memory (docs/precision_and_memory.md)
                            "--cpu-step", "after-backward",
                            "--save-dir", str(tmp_path / "unused"), "--max-update", "1"])
    run = Run(cfg, make_context(0, 0, 1, use_cuda=True, backend=None))
    try:
        trainer = run.trainer
        itr = run.batch_iterator(cfg.dataset.train_subset, epoch=1, shuffle=False).next_epoch_itr(shuffle=False)
        batch = next(iter(itr))
        trainer.set_dummy_batch(batch)
        grads = {}
        step = trainer.optimizer.step

        def recording_step(*args, **kwargs):  # the gradients as the optimizer sees them
            grads.update({id(p): _local(p.grad) for p in trainer.params if p.grad is not None})
            return step(*args, **kwargs)

        trainer.optimizer.step = recording_step
        assert trainer.train_step([batch])["stepped"]
        for p in trainer.params:
            local = _local(p)
            assert local.device.type == "cpu" and local.is_pinned(), p.shape
            assert grads[id(p)].device.type == "cpu" and grads[id(p)].is_pinned(), p.shape
            for value in trainer.optimizer.state[p].values():
                if torch.is_tensor(value) and value.numel() > 1:
                    assert _local(value).device.type == "cpu", p.shape
        buffers = list(trainer.model.buffers())
        assert buffers and all(b.device.type == "cuda" for b in buffers)
    finally:
        run.close()
