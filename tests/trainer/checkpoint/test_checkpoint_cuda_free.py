"""Sharded saves make no CUDA call where there is nothing on a GPU, even on a machine with GPUs.

Found by reading DCP's writer: with default arguments it copies tensors to the host ahead of the
write through the calling thread's current CUDA stream whenever CUDA is available, host tensors or
not. So a ``--cpu`` run opened a CUDA context on every rank at its first sharded save, and an
``--async-save``'s writer thread (a new thread: its current device is 0) synchronized device 0 from
every rank. Here torch.cuda is a recording stand-in that says it is available (cuda_stand_in.py);
tests/gpu/test_cpu_flag_no_cuda.py checks the same on real GPUs.
"""

import pytest
import torch

from cuda_stand_in import CudaRecorder, GpuHostMemory
from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer import loop
from shardtrain.trainer.checkpoint.consolidate import file_to_sharded, read_sharded
from shardtrain.trainer.checkpoint.sharded import load_sharded_into
from shardtrain.trainer.checkpoint.sharded_saver import ShardedSaver
from shardtrain.trainer.launch.start import call_main
from st_testutils import make_space_data_bin, tiny_model_flags


def _trained(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


def _equal_after_load(path, model, optimizer) -> bool:
    fresh, fresh_optimizer = _trained(seed=1)  # other values: a load that reads nothing is seen
    load_sharded_into(path, fresh, fresh_optimizer)
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    moments = [(optimizer.state[p], fresh_optimizer.state[q]) for p, q in zip(model.parameters(), fresh.parameters())]
    return same and all(torch.equal(a[k], b[k]) for a, b in moments for k in a)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_save_of_host_state_makes_no_cuda_call(tmp_path, monkeypatch, async_save):
    """The --cpu run's save, and --async-save's, whose write runs on another thread (and whose stager
    copies the step counts into host buffers)."""
    model, optimizer = _trained()
    cuda = CudaRecorder(monkeypatch)
    saver = ShardedSaver(async_save=async_save)
    path = saver.save(str(tmp_path), "checkpoint_1_1", model, optimizer, extra={}, aliases=[])
    saver.close()
    assert cuda.calls == []
    assert _equal_after_load(path, model, optimizer)


def test_a_gpu_ranks_async_save_waits_for_its_own_device_once_and_its_writer_touches_none(tmp_path, monkeypatch):
    """The state of rank 1 on cuda:1 (a stand-in): every tensor gets a pinned buffer and a non-blocking
    copy, save() waits for cuda:1 once before it returns, and the writer thread (whose current device
    would be 0) makes no CUDA call at all."""
    model, optimizer = _trained()
    cuda = CudaRecorder(monkeypatch)
    torch.cuda.set_device(1)  # as the launcher does on rank 1
    saver = ShardedSaver(async_save=True)
    gpu = saver.stager.memory = GpuHostMemory(torch.device("cuda", 1))
    tensors = len(model.state_dict()) + sum(len(s) for s in optimizer.state.values())  # 4 + 4 x (step, 2 moments)
    path = saver.save(str(tmp_path), "checkpoint_1_1", model, optimizer, extra={}, aliases=[])
    assert gpu.waits == [(torch.device("cuda", 1), "MainThread")]  # before save() returned
    saver.wait()
    assert tensors == 16 and len(gpu.allocated) == tensors and all(pinned for *_, pinned in gpu.allocated)
    assert len(gpu.copies) == tensors and all(non_blocking for _, non_blocking in gpu.copies)
    assert gpu.waits == [(torch.device("cuda", 1), "MainThread")]
    assert cuda.calls == [("torch.cuda.set_device", "MainThread", 1)]  # the test's own call, nothing after it
    assert _equal_after_load(path, model, optimizer)
    saver.close()


def test_converting_a_checkpoint_file_to_a_sharded_directory_makes_no_cuda_call(tmp_path, monkeypatch):
    """shard-consolidate's file -> directory, on a GPU machine (the state is read onto the host)."""
    state = {"model": {"w": torch.arange(12.0).reshape(3, 4)}, "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}},
             "cfg": {}}
    torch.save(state, tmp_path / "c.pt")
    cuda = CudaRecorder(monkeypatch)
    file_to_sharded(str(tmp_path / "c.pt"), str(tmp_path / "dir"))
    assert cuda.calls == []
    assert torch.equal(read_sharded(str(tmp_path / "dir"), model_only=True)["model"]["w"], state["model"]["w"])


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_space_data_bin(str(tmp_path_factory.mktemp("cudafree")), n_words=8, train_tokens=2000)


@pytest.mark.slow
@pytest.mark.usefixtures("warm_ranks")  # ranks kept alive across tests: tests/helpers/warm_ranks.py
@pytest.mark.parametrize("saving", [[], ["--async-save"]])
def test_a_cpu_run_saving_sharded_checkpoints_makes_no_cuda_call(data_bin, tmp_path, monkeypatch, saving):
    """The whole --cpu run (fully_sharded, one process), on a machine that says it has 2 GPUs."""
    cfg = parse_train_args([data_bin, *tiny_model_flags(), "--cpu", "--ddp-backend", "fully_sharded",
                            "--distributed-world-size", "1", "--max-update", "4", "--save-interval-updates", "2",
                            "--disable-validation", "--save-dir", str(tmp_path), "--log-format", "none", *saving])
    cuda = CudaRecorder(monkeypatch)
    call_main(cfg, loop.main)
    assert (tmp_path / "checkpoint_1_2" / "COMPLETE").exists() and (tmp_path / "checkpoint_1_4" / "COMPLETE").exists()
    assert cuda.calls == []
