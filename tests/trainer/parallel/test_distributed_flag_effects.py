"""[distributed training] flags at non-default values, each with its effect on the wrapped model (issue 29).
In process, on one gloo rank: the flags are parsed as shard-train parses them, the backend built from
them wraps a small model, and the wrapped model shows the difference.

On one rank DDP puts every gradient in one bucket whatever --bucket-cap-mb says, so that flag is checked
as the cap DDP was given; the others change what one rank can see."""
import pytest
import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.launch.one_rank_group import OneRankGroup
from shardtrain.trainer.parallel.choose import build_backend
from shardtrain.trainer.parallel.ddp import DDPBackend
from shardtrain.trainer.parallel.prepare import prepare_model
from shardtrain.trainer.precision.choose import run_dtypes
from st_testutils import TwoBlocks


def one_rank():
    return make_context(0, 0, 1, use_cuda=False, backend=None)


def ddp(model, *flags):
    cfg = parse_train_args(["data-bin", "--ddp-backend", "pytorch_ddp", *flags])
    return DDPBackend(one_rank(), cfg.distributed).wrap(model)


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.used(x)


@pytest.mark.flag_effect("--bucket-cap-mb", "--gradient-as-bucket-view", "--find-unused-parameters")
def test_ddp_flags_reach_distributed_data_parallel(one_rank_group):
    assert ddp(nn.Linear(4, 4)).bucket_bytes_cap == 25 * 2 ** 20
    assert ddp(nn.Linear(4, 4), "--bucket-cap-mb", "2").bucket_bytes_cap == 2 * 2 ** 20
    storages = {}
    for name, flags in (("own", []), ("views", ["--gradient-as-bucket-view"])):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        wrapped = ddp(model, *flags)  # kept: the bucket the gradients view lives as long as DDP
        wrapped(torch.ones(2, 4)).sum().backward()
        storages[name] = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    assert len(storages["own"]) == 4 and len(storages["views"]) == 1  # four gradients in the one bucket
    wrapped = ddp(Unused(), "--find-unused-parameters")
    for _ in range(2):
        wrapped(torch.ones(2, 4)).sum().backward()
    strict = ddp(Unused())
    strict(torch.ones(2, 4)).sum().backward()
    with pytest.raises(RuntimeError, match="Expected to have finished reduction"):
        strict(torch.ones(2, 4)).sum().backward()


class Flat(nn.Module):
    """No ``blocks``: fully_sharded groups its modules by --min-params-to-wrap."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(100, 100), nn.Linear(100, 100), nn.Linear(100, 2)  # 10,100 each

    def init_weights(self):
        for module in (self.a, self.b, self.c):
            module.reset_parameters()

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def fully_sharded(model_cls, check, *flags):
    cfg = parse_train_args(["data-bin", "--ddp-backend", "fully_sharded", *flags])
    with OneRankGroup(torch.device("cpu")):  # as a one-process run starts it for fully_sharded
        return check(prepare_model(model_cls, build_backend(cfg, one_rank(), run_dtypes(cfg)), seed=1))


def units(model):
    return [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]


@pytest.mark.flag_effect("--min-params-to-wrap")
def test_min_params_to_wrap_decides_the_fsdp_units():
    assert fully_sharded(Flat, units) == [""]  # 100M by default: the root is the only unit
    assert fully_sharded(Flat, units, "--min-params-to-wrap", "10000") == ["", "a", "b"]  # c is below it


def _after_forward(model):
    model(torch.ones(2, 8))
    return {type(p).__name__ for p in model.blocks[0].parameters()}


@pytest.mark.flag_effect("--no-reshard-after-forward")
def test_no_reshard_after_forward_keeps_the_gathered_parameters_for_backward():
    assert fully_sharded(TwoBlocks, _after_forward) == {"DTensor"}  # resharded: the block holds its shards
    assert fully_sharded(TwoBlocks, _after_forward, "--no-reshard-after-forward") == {"Parameter"}


@pytest.mark.flag_effect("--reduce-in-low-precision")
def test_reduce_in_low_precision_sets_the_reduction_dtype():
    # one rank sums nothing, so the dtype of the reduction is what can be seen here
    for flag, dtype in (("--bf16", torch.bfloat16), ("--fp16", torch.float16)):
        assert run_dtypes(parse_train_args(["data-bin", flag])).policy.reduce_dtype == torch.float32
        policy = run_dtypes(parse_train_args(["data-bin", flag, "--reduce-in-low-precision"])).policy
        assert (policy.param_dtype, policy.reduce_dtype) == (dtype, dtype)
