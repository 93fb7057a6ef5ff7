"""--zero-sharding: the flag, its compatibility rule, when it shards, and the state-dict
format of ShardedStateOptimizer in a one-rank group (no spawned processes)."""
import copy

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.optim.registry import OptimizerSpec
from shardtrain.trainer import build
from shardtrain.trainer.resolved import Components
from shardtrain.trainer.parallel.zero import ShardedStateOptimizer
from shardtrain.trainer.parallel.zero_sharding import shards_optimizer_state

ADAMW = OptimizerSpec(torch.optim.AdamW, {"betas": (0.9, 0.98), "eps": 1e-8, "weight_decay": 0.1, "fused": True})


def parse(*args):
    return parse_train_args(["data-bin", *args])


def test_flag_default_and_choices(capsys):
    assert parse().distributed.zero_sharding == "none"
    assert parse("--zero-sharding", "os").distributed.zero_sharding == "os"
    with pytest.raises(SystemExit):
        parse("--zero-sharding", "full")
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("backend", ["pytorch_ddp", "c10d", "legacy_ddp", "no_c10d"])
def test_data_parallel_backends_accept_it(backend):
    assert parse("--zero-sharding", "os", "--ddp-backend", backend).distributed.ddp_backend == backend


def test_fully_sharded_refuses_it_up_front():
    with pytest.raises(ConfigError) as info:
        parse("--zero-sharding", "os", "--ddp-backend", "fully_sharded")
    message = str(info.value)
    assert "--zero-sharding" in message and "fully_sharded already does" in message
    assert "drop --zero-sharding" in message
    parse("--ddp-backend", "fully_sharded")  # the default, none, is fine


def test_when_the_optimizer_state_is_sharded():
    assert shards_optimizer_state("os", 2) and shards_optimizer_state("os", 8)
    assert not shards_optimizer_state("os", 1)  # one process: nothing to shard
    assert not shards_optimizer_state("none", 2)


def test_one_process_keeps_the_plain_optimizer():
    cfg = parse("--zero-sharding", "os", "--optimizer", "adam", "--weight-decay", "0.1")
    optimizer = build.build_optimizer(cfg, Components.of(cfg), [torch.nn.Parameter(torch.ones(3))], torch.device("cpu"))
    assert type(optimizer) is torch.optim.AdamW


def model_and_steps(optimizer_factory, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    optimizer = optimizer_factory(model.parameters())
    for _ in range(steps):
        model(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def assert_same_state(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for param, state in a["state"].items():
        assert state.keys() == b["state"][param].keys()
        for k, v in state.items():
            assert torch.equal(v, b["state"][param][k]), (param, k)


def test_state_dicts_are_the_plain_optimizers(one_rank_group):
    plain_model, plain = model_and_steps(lambda p: ADAMW.build(p, 0.01))
    model, sharded = model_and_steps(lambda p: ShardedStateOptimizer(p, ADAMW, 0.01))
    assert type(sharded.optim) is torch.optim.AdamW and sharded.optim.param_groups[0]["fused"]
    assert sharded.state is sharded.optim.state and len(sharded.state) == 4  # what memory accounting reads
    assert_same_state(sharded.state_dict(), plain.state_dict())  # indexed over all parameters
    named = get_optimizer_state_dict(model, sharded)
    assert_same_state(named, get_optimizer_state_dict(plain_model, plain))
    assert "0.weight" in named["state"]


def test_loads_a_name_keyed_state_and_continues_exactly(one_rank_group):
    plain_model, plain = model_and_steps(lambda p: ADAMW.build(p, 0.01))
    saved = copy.deepcopy(get_optimizer_state_dict(plain_model, plain))
    kept = copy.deepcopy(saved)
    model, sharded = model_and_steps(lambda p: ShardedStateOptimizer(p, ADAMW, 0.5), steps=0)
    model.load_state_dict(plain_model.state_dict())
    set_optimizer_state_dict(model, sharded, saved)
    assert_same_state(saved, kept)  # loading left the checkpoint's dict as it was
    assert sharded.param_groups[0]["lr"] == sharded.optim.param_groups[0]["lr"] == 0.01  # the saved lr
    assert sharded.state is sharded.optim.state and len(sharded.state) == 4  # the loaded shard
    for m, o in ((plain_model, plain), (model, sharded)):
        torch.manual_seed(1)
        m(torch.randn(5, 4)).pow(2).sum().backward()
        o.step()
    for a, b in zip(plain_model.parameters(), model.parameters()):
        assert torch.equal(a, b)


def test_a_state_of_another_shape_is_refused(one_rank_group):
    _, sharded = model_and_steps(lambda p: ShardedStateOptimizer(p, ADAMW, 0.01), steps=1)
    state = sharded.state_dict()
    state["param_groups"][0]["params"] = state["param_groups"][0]["params"][:-1]
    with pytest.raises(ValueError, match="doesn't match the size"):
        sharded.load_state_dict(state)
