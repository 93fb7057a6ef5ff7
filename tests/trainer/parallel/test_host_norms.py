"""The gradient norm on the host's cores (trainer/parallel/host_norms.py) has today's bits: those of
``torch.nn.utils.get_total_norm(grads, foreach=True)``, on several thread counts and several chunkings of the same
gradient into tensors; and the tensors' norms do run on several threads."""
import threading

import pytest
import torch
from torch.distributed.tensor import Shard, distribute_tensor

from shardtrain.trainer.parallel import host_norms
from shardtrain.trainer.parallel.host_norms import host_total_norm, local_norms


def _gradient():
    g = torch.Generator().manual_seed(7)
    # values over 12 decades: a sum of squares in another order would round differently
    return torch.randn(300_001, generator=g) * torch.logspace(-6, 6, 300_001)


@pytest.mark.parametrize("chunks", [1, 3, 7, 16])
def test_the_norm_has_todays_bits_on_any_number_of_threads(chunks):
    grads = list(torch.tensor_split(_gradient(), chunks))
    today = torch.nn.utils.get_total_norm(grads, foreach=True)
    for threads in (1, 2, 3, 8):
        assert torch.equal(host_total_norm(grads, threads), today), (chunks, threads)


def test_the_bits_depend_on_how_the_sum_is_split():
    """What makes the test above worth having: the same gradient normed in two halves gives other bits."""
    halves = torch.stack([torch.linalg.vector_norm(h) for h in torch.tensor_split(_gradient(), 2)])
    assert not torch.equal(torch.linalg.vector_norm(halves), torch.linalg.vector_norm(_gradient()))


def test_sharded_gradients_have_todays_bits(one_rank_group):
    grads = [distribute_tensor(t, one_rank_group, [Shard(0)]) for t in torch.tensor_split(_gradient(), 5)]
    today = torch.nn.utils.get_total_norm(grads, foreach=True).full_tensor()
    for threads in (1, 4):
        assert torch.equal(host_total_norm(grads, threads), today)


def test_the_tensors_norms_spread_over_threads(monkeypatch):
    names, barrier = set(), threading.Barrier(2, timeout=10)
    norm = host_norms._norm

    def recorded(t):
        names.add(threading.current_thread().name)
        barrier.wait()  # two norms at once, or this times out
        return norm(t)

    monkeypatch.setattr(host_norms, "_norm", recorded)
    local_norms([torch.ones(4), torch.ones(3)], threads=2)
    assert len(names) == 2


def test_other_gradients_are_left_to_torch():
    assert host_total_norm([torch.ones(2, dtype=torch.float16)]) is None  # fp16: the fp32 accumulation recipe
    assert host_total_norm([torch.ones(2), torch.ones(2, dtype=torch.float64)]) is None  # torch groups by dtype
    assert host_total_norm([]) is None
