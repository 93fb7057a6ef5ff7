"""core/dtensors.py: ``isinstance(t, DTensor)`` without importing DTensor where none can exist."""
import sys

import torch
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from shardtrain.core.dtensors import is_dtensor, local_tensor


def test_a_dtensor_is_one_and_its_local_shard_is_what_it_writes_into(one_rank_group):
    d = distribute_tensor(torch.arange(4.0), one_rank_group, [Shard(0)])
    assert isinstance(d, DTensor) and is_dtensor(d)
    with torch.no_grad():
        local_tensor(d).add_(1.0)
    assert torch.equal(d.full_tensor(), torch.arange(4.0) + 1)
    plain = torch.ones(2)
    assert not is_dtensor(plain) and local_tensor(plain) is plain


def test_without_the_module_the_answer_is_no_and_nothing_is_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch.distributed.tensor")
    assert not is_dtensor(torch.ones(2))
    assert "torch.distributed.tensor" not in sys.modules
