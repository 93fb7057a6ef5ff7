"""Per-rank RNG runs shared by tests/trainer/test_rng_per_rank_cpu.py (gloo on the CPU) and
tests/gpu/test_rng_per_rank.py (NCCL); the entry points are importable by spawned children."""
import contextlib
import functools
import os
import random

import torch
import torch.distributed as dist

from equivalence_mains import record_losses
from optim_mains import run_each
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import call_main
from shardtrain.trainer.loop import Run, train
from shardtrain.trainer.launch.ranks import gather_to_rank0
from st_testutils import make_space_data_bin

UPDATES, HALF = 8, 4  # checkpoints are saved at HALF; resumed runs start there
SEED = 3


def make_data_bin(directory: str) -> str:
    # lines of 3 to 15 tokens, one sentence per sample (--sample-break-mode eos): batches of
    # uneven shapes, so dropout consumes different amounts of random numbers on each rank
    return make_space_data_bin(directory, n_words=8, train_tokens=3000, valid_tokens=100,
                               line_len=[3, 9, 5, 15, 7, 12, 4, 10])


def config(data_bin, save_dir, world_size, *flags, cuda=False):
    return parse_train_args([
        data_bin, "--arch", "transformer_lm", "--decoder-layers", "2", "--decoder-embed-dim", "16",
        "--decoder-ffn-embed-dim", "32", "--decoder-attention-heads", "2", "--tokens-per-sample", "16",
        "--sample-break-mode", "eos", "--batch-size", "4", "--required-batch-size-multiple", "1",
        "--dropout", "0.2", "--attention-dropout", "0.1", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.5",
        "--lr-scheduler", "fixed", "--max-update", str(UPDATES), "--save-interval-updates", str(HALF),
        "--disable-validation", "--seed", str(SEED), "--threads", "1", "--log-format", "none",
        "--save-dir", str(save_dir), "--distributed-world-size", str(world_size), "--heartbeat-timeout", "60",
        *([] if cuda else ["--cpu"]), *flags])


def straight_and_resumed(data_bin, root, world_size, cuda=False, fake_gpu_state=False):
    """In one spawn, for each form (pytorch_ddp's file, fully_sharded's directory): UPDATES
    straight (saving at HALF), then a resume from the HALF checkpoint. ``fake_gpu_state``: the
    file gets a GPU generator state on every rank first. Returns {form: (straight, resumed)}."""
    def job(name, backend, *flags):
        return train_drawing_per_rank, config(data_bin, os.path.join(root, name), world_size, "--ddp-backend",
                                              backend, "--log-file", os.path.join(root, "ranks.log"), *flags,
                                              cuda=cuda)

    half_file = os.path.join(root, "file", f"checkpoint_1_{HALF}.pt")
    half_dir = os.path.join(root, "sharded", f"checkpoint_1_{HALF}")
    jobs = [job("file", "pytorch_ddp"), *([(add_fake_device_rng, half_file)] if fake_gpu_state else []),
            job("file_resumed", "pytorch_ddp", "--restore-file", half_file),
            job("sharded", "fully_sharded"), job("sharded_resumed", "fully_sharded", "--restore-file", half_dir)]
    results = [r for r in call_main(jobs[0][1], functools.partial(run_each, jobs)) if r is not None]
    return {"file": (results[0], results[1]), "sharded": (results[2], results[3])}


def assert_resumed_bit_identically(straight, resumed, world_size):
    """UPDATES straight == HALF, resume, HALF: every loss, every rank's own draws, every weight."""
    (losses, weights, draws), (resumed_losses, resumed_weights, resumed_draws) = straight, resumed
    assert len(losses) == UPDATES and losses[HALF:] == resumed_losses, (losses[HALF:], resumed_losses)
    if world_size > 1:
        assert draws[0] != draws[1]  # the ranks' streams differ (else a resume could not tell them apart)
    for rank in range(world_size):  # each rank's torch and Python streams continue
        assert draws[rank][HALF:] == resumed_draws[rank], (rank, draws[rank][HALF:], resumed_draws[rank])
    assert weights.keys() == resumed_weights.keys()
    for k in weights:
        assert (weights[k] == resumed_weights[k]).all(), k


def train_drawing_per_rank(cfg, ctx):
    """Train through the real loop while each rank also draws numbers of its own before
    every update: rank r draws r + 1 times from torch (on its device) and from Python's
    random, so the ranks' streams part ways even where their batches are alike (a GPU
    dropout call advances the generator by the same step whatever the batch's shape).
    Rank 0 returns (per-update losses, the full final weights, every rank's draws)."""
    with _deterministic_kernels(ctx.device):
        return _train_drawing(cfg, ctx)


def _train_drawing(cfg, ctx):
    random.seed(cfg.common.seed)  # every rank starts alike, as torch's generators do
    run = Run(cfg, ctx)
    losses, draws = record_losses(run.trainer), []
    step = run.trainer.train_step

    def drawing_step(samples):
        n = ctx.rank + 1
        draws.append(([torch.rand(1, device=ctx.device).item() for _ in range(n)],
                      [random.random() for _ in range(n)]))
        return step(samples)

    run.trainer.train_step = drawing_step
    try:
        train(run)
        weights = run.backend.model_state_dict(run.trainer.model)  # a collective under FSDP
        every_rank = gather_to_rank0(draws)
    finally:
        run.close()
    return (losses, {k: v.cpu().numpy() for k, v in weights.items()}, every_rank) if ctx.is_master else None


@contextlib.contextmanager
def _deterministic_kernels(device):
    """On a GPU, kernels that add in a varying order (attention backward's atomics) would make two
    runs differ with or without the right generators; the CPU's kernels are deterministic already."""
    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS first runs
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])


def add_fake_device_rng(path: str, ctx) -> None:
    """Give every rank's entry in the single-file checkpoint ``path`` a GPU generator
    state, as a run on GPUs saves one (a job for optim_mains.run_each)."""
    if ctx.rank == 0:
        state = torch.load(path, weights_only=True)
        for entry in state["rng_per_rank"]:
            entry["cuda"] = torch.arange(16, dtype=torch.uint8)  # a CUDA generator's 16 bytes
        torch.save(state, path)
    if dist.is_initialized():
        dist.barrier()
