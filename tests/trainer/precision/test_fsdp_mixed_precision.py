"""fully_sharded's mixed-precision policy: compute in --bf16/--fp16 from fp32 shards, reduce the
gradients in fp32 unless --reduce-in-low-precision. On one rank a bf16 reduction changes no value
(there is nothing to sum), so the decision itself is tested here."""
import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from shardtrain.trainer.precision.registry import Dtypes, PrecisionKind, decide_dtypes, mixed_precision


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_compute_reduces_in_fp32_by_default(dtype):
    policy = mixed_precision(dtype, reduce_in_low_precision=False)
    assert policy.param_dtype == dtype and policy.reduce_dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduce_in_low_precision_reduces_in_the_compute_dtype(dtype):
    policy = mixed_precision(dtype, reduce_in_low_precision=True)
    assert policy.param_dtype == dtype and policy.reduce_dtype == dtype


def test_fp32_is_torchs_default_policy():
    assert mixed_precision(None, reduce_in_low_precision=False) == MixedPrecisionPolicy()


def test_a_runs_dtypes_follow_its_precisions_facts():
    """decide_dtypes on kinds made here (not the registered ones): the model is cast only where it is stored in
    the compute dtype, and the policy is the one above."""
    mixed = type("Mixed", (PrecisionKind,), {"name": "st_mixed", "compute": torch.float16})
    stored = type("Stored", (PrecisionKind,), {"name": "st_stored", "compute": torch.bfloat16,
                                               "stores_in_compute": True})
    fp16_policy = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
    assert decide_dtypes(mixed, False) == Dtypes("st_mixed", torch.float16, None, False)
    assert decide_dtypes(mixed, False).policy == fp16_policy
    bf16_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    assert decide_dtypes(stored, True) == Dtypes("st_stored", torch.bfloat16, torch.bfloat16, True)
    assert decide_dtypes(stored, True).policy == bf16_policy
