"""Per-rank RNG on GPUs: each rank saves and restores its own device's generator only.

The runs of tests/trainer/test_rng_per_rank_cpu.py on CUDA/NCCL. A GPU dropout call
advances the generator by the same step whatever the batch's shape, so the ranks'
GPU streams part ways through rng_mains' per-rank draws on the device; a resume that
restored rank 0's GPU state (or every visible GPU's) on every rank changes rank 1's
dropout masks and fails the bit-identity check.
"""

import pytest
import torch

from conftest import needs_gpus

# The runs live in tests/helpers/ (on sys.path via tests/conftest.py), shared with the CPU test: one copy.
from rng_mains import assert_resumed_bit_identically, make_data_bin, straight_and_resumed  # noqa: E402
from shardtrain.trainer.rng import rng_state, set_rng_state  # noqa: E402
from st_testutils import last_checkpoint_state  # noqa: E402


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("rng-gpu")))


def _saved_gpu_states(save_dir, world_size):
    saved = last_checkpoint_state(save_dir)["rng_per_rank"]
    assert len(saved) == world_size
    assert all(torch.is_tensor(entry["cuda"]) for entry in saved)  # the rank's own GPU, not a list of all
    return [entry["cuda"] for entry in saved]


@needs_gpus(2)
def test_two_gpus_resume_bit_identically_from_each_ranks_own_gpu_state(data_bin, tmp_path):
    results = straight_and_resumed(data_bin, str(tmp_path), 2, cuda=True)
    for form in ("file", "sharded"):  # pytorch_ddp, fully_sharded
        assert_resumed_bit_identically(*results[form], world_size=2)
        gpu = _saved_gpu_states(tmp_path / form, 2)
        assert not torch.equal(gpu[0], gpu[1]), form


@needs_gpus(1)
def test_one_gpu_resumes_bit_identically(data_bin, tmp_path):
    results = straight_and_resumed(data_bin, str(tmp_path), 1, cuda=True)
    for form in ("file", "sharded"):
        assert_resumed_bit_identically(*results[form], world_size=1)
        _saved_gpu_states(tmp_path / form, 1)


@needs_gpus(1)
def test_a_saved_gpu_state_goes_into_this_process_device_only():
    device = torch.cuda.current_device()
    torch.rand(1, device="cuda")  # this process now uses its GPU
    before = [torch.cuda.get_rng_state(d) for d in range(torch.cuda.device_count())]
    try:
        state = rng_state()
        assert torch.equal(state["cuda"], before[device])
        expected = torch.rand(4, device="cuda").tolist()
        advanced = torch.cuda.get_rng_state(device)
        set_rng_state(state)
        assert torch.rand(4, device="cuda").tolist() == expected
        # an older checkpoint's list of every visible GPU's state: only this device's entry is used
        older = [advanced] * len(before)
        older[device] = state["cuda"]
        set_rng_state({**state, "cuda": older})
        assert torch.rand(4, device="cuda").tolist() == expected
        for d, saved in enumerate(before):
            if d != device:
                assert torch.equal(torch.cuda.get_rng_state(d), saved), d  # other GPUs untouched
    finally:
        for d, saved in enumerate(before):
            torch.cuda.set_rng_state(saved, d)
