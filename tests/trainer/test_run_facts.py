"""The run's facts (shardtrain/trainer/run_facts.py), decided once from the config and the world: every fact
written down by hand for configurations away from the defaults, and a run that asks for them once (the backend,
the fit check and the trainer read those, and do not work them out again)."""
import pytest
import torch

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer import run as run_module
from shardtrain.trainer.launch.start import make_context
from shardtrain.trainer.resolved import Components
from shardtrain.trainer.run_facts import run_facts
from st_testutils import tiny_model_flags
from small_trainer import data_bin  # noqa: F401 (a fixture)


def facts_of(argv, world, per_node):
    cfg = parse_train_args(["data-bin", *argv])
    return run_facts(cfg, Components.of(cfg), world, per_node)


def test_hybrid_offload_bf16_on_two_nodes_of_two():
    facts = facts_of(["--ddp-backend", "fully_sharded", "--fsdp-sharding-strategy", "hybrid_shard", "--cpu-offload",
                      "--offload-activations", "--bf16", "--update-freq", "3,1", "--optimizer", "cpu_adam"],
                     world=4, per_node=2)
    assert facts.backend.__name__ == "FullyShardedBackend"
    assert (facts.world_size, facts.ranks_per_node, facts.shards, facts.zero_shards) == (4, 2, 2, 1)  # a node's ranks
    assert facts.state_on_host and facts.optimizer_on_host
    assert facts.checkpoint_every == 1 and facts.checkpointed  # --offload-activations implies checkpointing
    assert facts.precision.name == "bf16" and facts.dtypes.compute == torch.bfloat16 and facts.dtypes.storage is None
    assert facts.param_bytes == 4 and facts.update_freq == 3  # the first epoch's --update-freq
    assert facts.spec.state_bytes == 8 and facts.spec.steps_on_cpu
    assert facts.staged_kinds == () and not facts.snapshot


def test_ddp_with_zero_memory_efficient_fp16_checkpointing_every_second_block():
    facts = facts_of(["--ddp-backend", "pytorch_ddp", "--zero-sharding", "os", "--memory-efficient-fp16",
                      "--optimizer", "adam", "--checkpoint-activations", "--checkpoint-activations-every", "2",
                      "--spike-rollback"], world=2, per_node=2)
    assert facts.backend.__name__ == "DDPBackend"
    assert (facts.shards, facts.zero_shards) == (1, 2)  # ZeRO shards the optimizer state over both ranks
    assert not facts.state_on_host and facts.optimizer_on_host  # adam steps fp16 parameters as cpu_adam, on the CPU
    assert facts.checkpoint_every == 2
    assert facts.precision.name == "memory_efficient_fp16" and facts.param_bytes == 2
    assert facts.dtypes.storage == torch.float16 and facts.snapshot


def test_one_rank_of_a_backend_that_does_not_wrap_one_is_single_process():
    facts = facts_of(["--ddp-backend", "pytorch_ddp", "--update-freq", "2"], world=1, per_node=1)
    assert facts.backend.__name__ == "SingleProcessBackend" and facts.shards == 1 and facts.update_freq == 2
    assert facts.precision.name == "fp32" and facts.dtypes.compute is None and not facts.checkpointed


@pytest.mark.slow
def test_a_run_works_its_facts_out_once_and_hands_them_on(data_bin, tmp_path, monkeypatch):  # noqa: F811
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[2:])
        return run_facts(*args, **kwargs)

    monkeypatch.setattr(run_module, "run_facts", counted)
    cfg = parse_train_args([data_bin, *tiny_model_flags(), "--no-save", "--save-dir", str(tmp_path / "s"),
                            "--ddp-backend", "fully_sharded", "--checkpoint-activations", "--update-freq", "2"])
    run = run_module.Run(cfg, make_context(0, 0, 1, use_cuda=False, backend=None))
    try:
        assert len(calls) == 1 and calls[0] == (1, 1)  # one rank, alone on its machine
        facts = run.facts
        assert type(run.backend) is facts.backend and facts.backend.__name__ == "FullyShardedBackend"
        assert run.trainer.precision.param_dtype is facts.dtypes.storage is None
        # a checkpointed block's forward is replaced on the instance (activation_checkpointing.py)
        checkpointed = ["forward" in vars(block) for block in run.trainer.model.blocks]
        assert facts.checkpoint_every == 1 and checkpointed == [True, True]
    finally:
        run.close()
