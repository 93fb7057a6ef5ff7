"""Every graph-changing model option trains under fp32, bf16 and fp16 (and
--memory-efficient-fp16 where allowed) with every backend, its activations in the compute dtype
(the matrix, and the dtype rule asserted: precision_mains.py; on CUDA:
tests/gpu/test_precision_matrix.py).

Two spawns' worth of cost, not one per case: the one-process cases run in this process, and every
pytorch_ddp and fully_sharded case runs in turn in one spawn of 2 gloo ranks.
"""
import pytest

from precision_mains import assert_all_trained, make_data_bin, run_matrix

TESTS_ROOM = "shardtrain.trainer.precision"  # it drives training runs: its imports cannot say which room it tests

# every test here starts a process, a multi-rank group or a training run; its ranks are warm ones (kept alive
# across tests, tests/helpers/warm_ranks.py): what the ranks do is the subject here, not how they start
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("warm_ranks")]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    return make_data_bin(str(tmp_path_factory.mktemp("precision")))


def test_one_process(data_bin, tmp_path):
    assert_all_trained(run_matrix(data_bin, str(tmp_path), ["single_process"], 1), ["single_process"])


def test_two_ranks(data_bin, tmp_path):
    backends = ["pytorch_ddp", "fully_sharded"]
    assert_all_trained(run_matrix(data_bin, str(tmp_path), backends, 2), backends)
