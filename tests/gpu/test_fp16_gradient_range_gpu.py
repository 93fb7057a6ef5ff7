"""fp16 gradient range on a GPU (issue 12, item 5): the CPU checks of
tests/trainer/precision/test_fp16_gradient_range.py with the model on CUDA (CUDA autocast,
CUDA fp16 kernels), where fp16 training actually runs."""
import os
import sys

import pytest

from conftest import needs_gpus

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "trainer", "precision"))
from fp16_range_helpers import big_vocab_data_bin  # noqa: E402
from test_fp16_gradient_range import CASES, PRECISIONS, check_fp16_follows_fp32, check_logit_gradients  # noqa: E402


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return big_vocab_data_bin(str(tmp_path_factory.mktemp("vocab32k")))


@needs_gpus(1)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_logit_gradients_on_gpu(data_bin, tmp_path, precision):
    check_logit_gradients(data_bin, str(tmp_path), precision, cpu=False)


@needs_gpus(1)
@pytest.mark.parametrize("optimizer, fp16, bound", CASES)
def test_fp16_follows_fp32_on_gpu(data_bin, tmp_path, optimizer, fp16, bound):
    check_fp16_follows_fp32(data_bin, tmp_path, optimizer, fp16, bound, cpu=False)
