"""The run-side CUDA defects of issue 28 (item 4) on a real GPU; tests/trainer/test_run_devices.py,
test_host_memory.py and test_spike_snapshot_memory.py reproduce each on the CPU with stand-ins.

- --fixed-validation-seed restores the rank's GPU generator after validation (torch.manual_seed re-seeds
  it; fork_rng(devices=[]) did not restore it), so training's dropout masks are those of a run whose
  validation is unseeded;
- a one-GPU run (no process group) makes its GPU current before main: CUDA is initialised there, and
  FSDP's DeviceMesh neither warns "did not set/select the default device" nor follows a LOCAL_RANK
  that names another GPU;
- --spike-rollback's snapshot lies where the memory check counts it: on the GPU, or for the state under
  --cpu-offload in host memory, the buffers on the GPU;
- the host memory the node's runs are sized by, with its cgroup limit.
"""
import os
import subprocess
import sys
import types

import pytest
import torch

import gpu_runs
from conftest import needs_gpus
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer import loop, validation
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.memory.fit import host_available_bytes
from st_testutils import fit_estimate, json_records

DEVICE_MESH_WARNING = "did not set/select the default device"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return gpu_runs.data_bin(tmp_path_factory.mktemp("run-devices"))


@needs_gpus(1)
def test_validation_with_a_fixed_seed_restores_the_gpu_generator(monkeypatch):
    device = torch.device("cuda", torch.cuda.current_device())
    torch.rand(8, device=device)  # training has drawn from it
    before = torch.cuda.get_rng_state(device)
    inside = []
    monkeypatch.setattr(validation, "_validate_subsets", lambda run, epoch: inside.append(torch.rand(8, device=device)))
    run = types.SimpleNamespace(cfg=types.SimpleNamespace(dataset=types.SimpleNamespace(fixed_validation_seed=3)),
                                backend=types.SimpleNamespace(device=device))
    loop.validate(run, epoch=1)
    loop.validate(run, epoch=1)
    assert torch.equal(torch.cuda.get_rng_state(device), before)
    assert torch.equal(inside[0], inside[1])  # validation itself is seeded on the GPU


@needs_gpus(1)
def test_training_dropout_is_untouched_by_seeded_validation(data, tmp_path):
    """Dropout 0.3, validating after every update: the losses equal those of the same run without
    --fixed-validation-seed (with the bug, every update after the first drew its masks from seed 123)."""
    flags = ["--dropout", "0.3", "--validate-interval-updates", "1", "--max-update", "4", "--no-save",
             "--seed", "7"]
    plain, _ = gpu_runs.train(data, tmp_path / "plain", *flags)
    seeded, valid = gpu_runs.train(data, tmp_path / "seeded", *flags, "--fixed-validation-seed", "123")
    assert len(plain) == len(seeded) == 4 and len(valid) >= 3
    assert [r["loss"] for r in seeded] == pytest.approx([r["loss"] for r in plain], rel=1e-4)


@needs_gpus(1)
def test_a_run_without_a_process_group_makes_its_gpu_current_before_main(tmp_path):
    """In a fresh process, main finds CUDA initialised on the rank's GPU (the last visible one here)."""
    code = ("import torch, types\n"
            "from shardtrain.trainer.launch import start\n"
            "n = torch.cuda.device_count()\n"
            "ctx = start.make_context(0, n - 1, 1, True, backend=None)\n"
            "cfg = types.SimpleNamespace(common=types.SimpleNamespace(threads=1))\n"
            "seen = start._run_rank(cfg, lambda cfg, ctx: (torch.cuda.is_initialized(), torch.cuda.current_device()),"
            " ctx, '', launcher=None)\n"
            "print('SEEN', seen == (True, n - 1))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=_env())
    assert done.returncode == 0 and "SEEN True" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return dict(env, **extra)


@needs_gpus(1)
@pytest.mark.parametrize("local_rank", [None, "past the last GPU"])
def test_fully_sharded_on_one_gpu_keeps_the_device_it_was_given(data, tmp_path, local_rank):
    """No DeviceMesh warning; and a stray LOCAL_RANK (no launcher: shard-train ignores it) naming a GPU that
    does not exist is not followed (DeviceMesh would set_device to it: invalid device ordinal)."""
    extra = {} if local_rank is None else {"LOCAL_RANK": str(torch.cuda.device_count())}
    log = tmp_path / "run.log"
    argv = [sys.executable, "-m", "shardtrain.cli.train", data, *gpu_runs.MODEL, "--ddp-backend", "fully_sharded",
            "--max-update", "2", "--no-save", "--disable-validation", "--save-dir", str(tmp_path / "ck"),
            "--log-file", str(log), "--log-format", "json", "--log-interval", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=_env(**extra))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert DEVICE_MESH_WARNING not in done.stderr + done.stdout + log.read_text()
    assert len(json_records(str(log), "train_inner")) == 2


def _snapshot_bytes_by_device(cfg):
    """One update, then a snapshot: its bytes by device type (scalars such as Adam's step left out)."""
    run = loop.Run(cfg, make_context(0, 0, 1, use_cuda=True, backend=None))
    try:
        trainer = run.trainer
        batch = next(iter(run.batch_iterator(cfg.dataset.train_subset, epoch=1, shuffle=False)
                          .next_epoch_itr(shuffle=False)))
        trainer.set_dummy_batch(batch)
        assert trainer.train_step([batch])["stepped"]
        run.spikes.take_snapshot(trainer, 1, 1)
        snap = run.spikes.snapshot
        tensors = snap.tensors + [v for s in snap.optimizer_state.values() for v in s.values() if torch.is_tensor(v)]
    finally:
        run.close()
    by_device = {"cpu": 0, "cuda": 0}
    for t in tensors:
        if t.numel() > 1:
            by_device[t.device.type] += t.nbytes
    return by_device


@needs_gpus(1)
@pytest.mark.parametrize("offload", [False, True])
def test_the_snapshot_lies_where_the_memory_check_counts_it(data, tmp_path, offload):
    flags = ["--ddp-backend", "fully_sharded", "--cpu-offload"] if offload else []
    cfg = parse_train_args([data, *gpu_runs.MODEL, "--optimizer", "adam", "--spike-rollback", "--no-save",
                            "--save-dir", str(tmp_path / "ck"), "--max-update", "1", *flags])
    est = fit_estimate(cfg)
    assert est.snapshot_state > 0 and est.snapshot_buffers > 0
    expected = ({"cpu": est.snapshot_state, "cuda": est.snapshot_buffers} if offload
                else {"cpu": 0, "cuda": est.snapshot_state + est.snapshot_buffers})
    assert _snapshot_bytes_by_device(cfg) == expected


@needs_gpus(1)
def test_the_host_memory_of_this_node(capsys):
    """What the node's runs and the headline scenario are sized by: MemAvailable, or less under the
    process's cgroup v2 limit (read here directly)."""
    with open("/proc/meminfo") as f:
        mem_available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    got = host_available_bytes()
    assert 0 < got <= mem_available
    with open("/proc/self/cgroup") as f:
        v2 = [line.strip()[3:] for line in f if line.startswith("0::")]
    limit_file = os.path.join("/sys/fs/cgroup", v2[0].lstrip("/"), "memory.max") if v2 else None
    if limit_file and os.path.exists(limit_file):
        text = open(limit_file).read().strip()
        if text != "max":
            assert got <= int(text)
    with capsys.disabled():
        print(f"\nhost memory available to this job: {got / 2 ** 30:.1f} GiB (MemAvailable {mem_available / 2 ** 30:.1f})")
