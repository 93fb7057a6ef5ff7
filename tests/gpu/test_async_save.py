"""--async-save on one GPU, with the state on the GPU and under --cpu-offload.

Resume: a run saving in the background at HALF, resumed from that checkpoint,
ends with the straight run's weights and optimizer state bit for bit (and its
later losses), as the sync save does, at an lr that moves every weight
(exact_resume.py).
Stall: the time training loses to an async save (save() returning, plus the
slow-down of the update overlapping the write). With the state on the GPU it is
a non-blocking copy to pinned memory (allocated by the first save, refilled by
the others), smaller than a sync save. Under --cpu-offload nothing is copied
(the CPU state is written live and the next optimizer step waits for the
write), so the stall is at most the write's time.
"""
import statistics
import time

import pytest
import torch

import gpu_runs
from conftest import needs_gpus
from exact_resume import DETERMINISTIC, HALF, MOVING_LR, assert_resumed_exactly, checkpoint_state, \
    straight_and_resumed
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.loop import Run
from shardtrain.trainer.checkpoint.sharded_saver import ShardedSaver

OFFLOAD = {"on_gpu": [], "cpu_offload": ["--cpu-offload"]}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return gpu_runs.data_bin(tmp_path_factory.mktemp("async"))


@needs_gpus(1)
@pytest.mark.parametrize("placement", sorted(OFFLOAD))
@pytest.mark.parametrize("saving", ["async", "sync"])
def test_resume_from_a_background_save_is_bit_exact(data, tmp_path, placement, saving, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # with the plugin: deterministic kernels
    flags = ["--ddp-backend", "fully_sharded", "--distributed-world-size", "1", *MOVING_LR, "--user-dir",
             DETERMINISTIC, *OFFLOAD[placement], *(["--async-save"] if saving == "async" else [])]
    losses, resumed_losses, straight, resumed = straight_and_resumed(gpu_runs.train, data, tmp_path, flags)
    halfway = checkpoint_state(str(tmp_path / "straight" / f"checkpoint_1_{HALF}"))
    assert_resumed_exactly(losses, resumed_losses, straight, resumed, halfway)


def timed_saves(cfg, ctx):
    """Sync save time; async stall (save() returning + the overlapping update's slow-down)."""
    run = Run(cfg, ctx)
    itr = run.batch_iterator("train", 1, shuffle=True).next_epoch_itr()

    def update():
        start = time.perf_counter()
        run.trainer.train_step([next(itr)])
        torch.cuda.synchronize()
        return time.perf_counter() - start

    for _ in range(2):
        update()
    normal = statistics.median(update() for _ in range(3))
    sync_saver, async_saver = ShardedSaver(async_save=False), ShardedSaver(async_save=True)
    sync, stall, allocations = [], [], []
    try:
        for i in range(3):
            start = time.perf_counter()
            sync_saver.save(cfg.checkpoint.save_dir, f"sync{i}", run.trainer.model, run.trainer.optimizer, {}, [])
            sync.append(time.perf_counter() - start)
            start = time.perf_counter()
            async_saver.save(cfg.checkpoint.save_dir, f"async{i}", run.trainer.model, run.trainer.optimizer, {},
                             [])
            returned = time.perf_counter() - start
            stall.append(returned + max(0.0, update() - normal))
            async_saver.wait()
            allocations.append(async_saver.stager.allocations)
        buffers = async_saver.stager.buffers().values()
        pinned = sum(b.numel() * b.element_size() for b in buffers if b.is_pinned())
    finally:
        async_saver.close()
        run.close()
    staged = {"in_place": async_saver.stager.in_place_bytes, "copied": async_saver.stager.copied_bytes,
              "pinned": pinned, "allocations": allocations}
    return statistics.median(sync), statistics.median(stall[1:]), staged  # the first async save allocates


@needs_gpus(1)
@pytest.mark.parametrize("placement", sorted(OFFLOAD))
def test_async_save_stalls_training_less_than_a_sync_save(data, tmp_path, placement):
    cfg = parse_train_args([
        data, "--arch", "transformer_lm", "--decoder-layers", "4", "--decoder-embed-dim", "1024",
        "--decoder-ffn-embed-dim", "4096", "--decoder-attention-heads", "8", "--tokens-per-sample", "64",
        "--batch-size", "4", "--optimizer", "adam", "--ddp-backend", "fully_sharded",
        "--distributed-world-size", "1", "--no-save", "--disable-validation", "--log-format", "none",
        "--save-dir", str(tmp_path), *OFFLOAD[placement]])
    sync, stall, staged = call_main(cfg, timed_saves)
    assert staged["allocations"][0] == staged["allocations"][2] > 0, f"buffers allocated once, refilled: {staged}"
    if placement == "on_gpu":
        assert staged["in_place"] == 0 and staged["copied"] > 0, f"GPU state is copied, never gated: {staged}"
        assert staged["pinned"] > 0.99 * staged["copied"], f"GPU state is staged in pinned memory: {staged}"
        assert stall < sync, f"on the GPU an async save stalls training {stall:.3f} s, a sync save {sync:.3f} s"
    else:
        assert staged["copied"] < staged["in_place"] / 100, f"offloaded state must not be copied: {staged}"
        assert stall < 1.2 * sync, f"under offload an async save stalls {stall:.3f} s, a sync save {sync:.3f} s"
