"""The gradient norm on the host's cores (trainer/parallel/host_norms.py) has today's bits: those of
``torch.nn.utils.get_total_norm(grads, foreach=True)``, on several thread counts and several chunkings of the same
gradient into tensors; and the tensors' norms do run on several threads, from SPREAD_FROM elements in all."""
import threading

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from shardtrain.trainer.parallel import host_norms
from shardtrain.trainer.parallel.host_norms import SPREAD_FROM, host_total_norm, local_norms


@pytest.fixture(autouse=True)
def spread_any_size(monkeypatch):
    """The tests below use small tensors, which the pool leaves on this thread (SPREAD_FROM): here it takes them."""
    monkeypatch.setattr(host_norms, "SPREAD_FROM", 0)


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


def test_fewer_elements_than_spread_from_stay_on_this_thread(monkeypatch):
    """A pool started for each norm cost a small model a third of its update (host_norms.py's figures)."""
    monkeypatch.setattr(host_norms, "SPREAD_FROM", 8)
    assert _threads_used(monkeypatch, lambda: local_norms([torch.ones(4), torch.ones(3)])) == {
        threading.main_thread()}  # 7 elements
    assert threading.main_thread() not in _threads_used(monkeypatch, lambda: local_norms([torch.ones(4)] * 2))
    assert SPREAD_FROM == 8_388_608  # the module's own (read before the fixtures): 32 MiB of fp32


def test_other_gradients_are_left_to_torch():
    assert host_total_norm([torch.ones(2, dtype=torch.float16)]) is None  # fp16: the fp32 accumulation recipe
    assert host_total_norm([torch.ones(2), torch.ones(2, dtype=torch.float64)]) is None  # torch groups by dtype
    assert host_total_norm([]) is None


def _threads_used(monkeypatch, run) -> set:
    """Which threads took the tensors' norms while ``run()`` ran (torch itself says it has 4 threads)."""
    used, norm = set(), host_norms._norm
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(host_norms, "_norm", lambda t: used.add(threading.current_thread()) or norm(t))
    run()
    return used


def test_the_callers_thread_count_wins_and_one_thread_is_this_one(monkeypatch, one_rank_group):
    here = {threading.main_thread()}
    two = [torch.ones(4), torch.ones(3)]
    assert _threads_used(monkeypatch, lambda: local_norms(two, threads=1)) == here
    assert _threads_used(monkeypatch, lambda: host_total_norm(two, threads=1)) == here
    shards = [distribute_tensor(t, one_rank_group, [Shard(0)]) for t in two]
    assert _threads_used(monkeypatch, lambda: host_total_norm(shards, threads=1)) == here
    assert here.isdisjoint(_threads_used(monkeypatch, lambda: local_norms(two)))  # torch's 4 threads: a pool
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert here.isdisjoint(_threads_used(monkeypatch, lambda: local_norms(two, threads=2)))
    meta = [torch.ones(4, device="meta"), torch.ones(3, device="meta")]  # not the host's: kernels only queued
    assert _threads_used(monkeypatch, lambda: local_norms(meta, threads=2)) == here


def test_the_largest_tensors_are_handed_out_first(monkeypatch):
    seen = {}

    class Pool:  # runs in order, and remembers how it was made and what it was handed
        def __init__(self, workers, thread_name_prefix):
            seen.update(workers=workers, prefix=thread_name_prefix)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def map(self, fn, order):
            seen["order"] = list(order)
            return [fn(i) for i in seen["order"]]

    monkeypatch.setattr(host_norms, "ThreadPoolExecutor", Pool)
    sizes = [1, 5, 3, 4]
    norms = local_norms([torch.ones(n) for n in sizes], threads=3)
    assert seen == {"workers": 3, "prefix": "grad-norm", "order": [1, 3, 2, 0]}
    assert [float(n) ** 2 for n in norms] == pytest.approx(sizes)  # back in the caller's order
    local_norms([torch.ones(2), torch.ones(2)], threads=8)
    assert seen["workers"] == 2  # no more threads than tensors


def test_one_sharded_gradient_and_a_replicated_one(one_rank_group):
    t = torch.arange(12.0)
    one = [distribute_tensor(t, one_rank_group, [Shard(0)])]
    assert torch.equal(host_total_norm(one, 2), torch.nn.utils.get_total_norm(one, foreach=True).full_tensor())
    assert host_total_norm([distribute_tensor(t, one_rank_group, [Replicate()])]) is None  # not the shards' recipe
