"""The precision matrix of tests/helpers/precision_mains.py on CUDA: every graph-changing
model option x fp32/bf16/fp16 (and --memory-efficient-fp16 where allowed) trains 2 updates with a
finite loss and its activations in the compute dtype. On CUDA autocast keeps LayerNorm in fp32,
which the rule allows; flash/efficient attention kernels run instead of the CPU's math kernel.
"""

import pytest

from conftest import needs_gpus

# The runs live in tests/helpers/ (on sys.path via tests/conftest.py), shared with the CPU test: one copy.
from precision_mains import assert_all_trained, make_data_bin, run_matrix  # noqa: E402


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("precision-gpu")))


@needs_gpus(1)
def test_one_gpu(data_bin, tmp_path):
    """One process, and fully_sharded on a 1-rank mesh (FSDP's mixed precision, no autocast)."""
    backends = ["single_process", "fully_sharded"]
    assert_all_trained(run_matrix(data_bin, str(tmp_path), backends, 1, cuda=True), backends)


@needs_gpus(2)
def test_two_gpus(data_bin, tmp_path):
    backends = ["pytorch_ddp", "fully_sharded"]
    assert_all_trained(run_matrix(data_bin, str(tmp_path), backends, 2, cuda=True), backends)
