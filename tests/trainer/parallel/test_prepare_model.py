"""prepare_model's order (build, init, activation checkpointing, storage dtype, wrap, materialise,
init), seen from a backend that records what it is handed, and on a real one-rank fully_sharded."""
import contextlib

import pytest
import torch
from torch import nn

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.parallel.base import Backend
from shardtrain.trainer.launch.one_rank_group import OneRankGroup
from shardtrain.trainer.parallel.choose import build_backend
from shardtrain.trainer.parallel.prepare import prepare_model
from shardtrain.trainer.precision.choose import run_dtypes

ONE_RANK = make_context(0, 0, 1, use_cuda=False, backend=None)


class Blocks(nn.Module):
    def __init__(self, events=None):
        super().__init__()
        self.events = events if events is not None else []
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    def init_weights(self):
        self.events.append(("init", self.blocks[0].weight.device.type))
        for block in self.blocks:
            nn.init.normal_(block.weight)
            nn.init.zeros_(block.bias)


class Recording(Backend):
    """Records what wrap and materialise see; ``init_on_meta`` as a sharding backend has it."""

    def __init__(self, events, init_on_meta):
        super().__init__(ONE_RANK, distributed=None)
        self.events, self.init_on_meta = events, init_on_meta

    def wrap(self, model):
        checkpointed = ["forward" in vars(block) for block in model.blocks]
        self.events.append(("wrap", checkpointed, model.blocks[0].weight.dtype, model.blocks[0].weight.device.type))
        return model

    @contextlib.contextmanager
    def materialise(self, model):
        model.to_empty(device="cpu")
        self.events.append(("materialise",))
        yield model


@pytest.mark.parametrize("on_meta", [True, False])
def test_the_steps_come_in_order(on_meta):
    events = []
    model = prepare_model(lambda: Blocks(events), Recording(events, on_meta), seed=3, param_dtype=torch.float16,
                          checkpoint_activations_every=2)
    if on_meta:  # built on meta, checkpointed and cast there, wrapped, then materialised and initialised
        assert events == [("wrap", [False, True, False], torch.float16, "meta"), ("materialise",), ("init", "cpu")]
    else:  # initialised as built, before anything else
        assert events == [("init", "cpu"), ("wrap", [False, True, False], torch.float16, "cpu")]
    assert model.blocks[0].weight.device.type == "cpu"


def test_the_same_seed_gives_the_same_weights_whatever_the_path():
    on_meta = prepare_model(Blocks, Recording([], True), seed=3)
    eager = prepare_model(Blocks, Recording([], False), seed=3)
    for a, b in zip(on_meta.parameters(), eager.parameters()):
        assert torch.equal(a, b)


def test_fully_sharded_on_one_rank_starts_from_the_unsharded_weights(tmp_path):
    """A real 1-rank FSDP2 mesh: sharded on the meta device, materialised, then initialised."""
    reference = prepare_model(Blocks, _backend(parse_train_args([str(tmp_path), "--cpu"])), seed=3)
    cfg = parse_train_args([str(tmp_path), "--cpu", "--ddp-backend", "fully_sharded"])
    with OneRankGroup(torch.device("cpu")):  # as a one-process run starts it for fully_sharded
        sharded = prepare_model(Blocks, _backend(cfg), seed=3, checkpoint_activations_every=1)
        for a, b in zip(sharded.parameters(), reference.parameters()):
            assert torch.equal(a.full_tensor(), b)
        assert all("forward" in vars(block) for block in sharded.blocks)


class NoInit(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 2)


def test_a_meta_backend_needs_init_weights():
    with pytest.raises(ConfigError, match=r"needs NoInit.init_weights\(\)"):
        prepare_model(NoInit, Recording([], True), seed=1)


def _backend(cfg):
    return build_backend(cfg, ONE_RANK, run_dtypes(cfg))
