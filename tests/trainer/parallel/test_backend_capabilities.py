"""--ddp-backend's choices come from the backend registry, and the flag checks and
build_backend ask a backend's capabilities (class attributes), never its name."""
import pytest

from shardtrain.config.run_config import parse_train_args
from shardtrain.core.errors import ConfigError
from shardtrain.core.registry import Entry
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.parallel.base import BACKEND_REGISTRY, Backend
from shardtrain.trainer.parallel.choose import build_backend, user_choices
from shardtrain.trainer.parallel.single_process import SingleProcessBackend
from shardtrain.trainer.precision.choose import run_dtypes


def parse(*args):
    return parse_train_args(["data-bin", *args])


class Offloading(Backend):
    """A plugin's backend that offloads and shards, like fully_sharded, without FSDP."""
    supports_cpu_offload = True
    shards_parameters = True
    wraps_a_single_rank = True


@pytest.fixture
def plugin_backend(monkeypatch):
    # Registered as a --user-dir plugin would be; monkeypatch takes it out again afterwards.
    monkeypatch.setitem(BACKEND_REGISTRY._entries, "offloading", Entry("offloading", Offloading))
    return "offloading"


def test_choices_are_the_registered_backends_users_may_pick(capsys):
    assert user_choices() == ["pytorch_ddp", "c10d", "legacy_ddp", "no_c10d", "fully_sharded"]
    assert "single_process" in BACKEND_REGISTRY and "single_process" not in user_choices()
    with pytest.raises(SystemExit):
        parse("--ddp-backend", "single_process")
    assert "invalid choice" in capsys.readouterr().err


def test_a_newly_registered_backend_is_a_choice(plugin_backend):
    assert user_choices()[-1] == plugin_backend
    assert parse("--ddp-backend", plugin_backend).distributed.ddp_backend == plugin_backend


def test_checks_ask_capabilities_and_name_every_backend_that_has_them(plugin_backend):
    parse("--ddp-backend", plugin_backend, "--cpu-offload")  # it has the capability: accepted
    with pytest.raises(ConfigError, match="--cpu-offload needs --ddp-backend fully_sharded or offloading"):
        parse("--cpu-offload")
    with pytest.raises(ConfigError, match="which --ddp-backend fully_sharded or offloading already does"):
        parse("--ddp-backend", plugin_backend, "--zero-sharding", "os")
    with pytest.raises(ConfigError, match="--async-save writes sharded checkpoints .* needs --ddp-backend "
                                          "fully_sharded;"):
        parse("--ddp-backend", plugin_backend, "--async-save")  # it does not save sharded checkpoints


def test_one_rank_runs_single_process_unless_the_backend_wraps_a_single_rank(plugin_backend):
    one_rank = make_context(0, 0, 1, use_cuda=False, backend=None)
    assert type(_build(parse("--ddp-backend", "pytorch_ddp"), one_rank)) is SingleProcessBackend
    backend = _build(parse("--ddp-backend", plugin_backend), one_rank)
    assert type(backend) is Offloading and backend.distributed.ddp_backend == plugin_backend


def _build(cfg, ctx):
    return build_backend(cfg, ctx, run_dtypes(cfg))
