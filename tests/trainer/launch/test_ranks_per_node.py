"""Ranks a node, counted once by the launch (``DistributedContext.ranks_per_node``) and read by everything that
needs it: the run's facts (a hybrid shard group, the node's memory), FSDP2's mesh and the thread policy. torchrun
inside a SLURM allocation is the case two rules used to split on: SLURM counts the torchrun agents (1 a node),
torchrun its ranks (LOCAL_WORLD_SIZE)."""
import pathlib

from shardtrain.config.run_config import parse_train_args
from shardtrain.trainer.launch import rendezvous, threads
from shardtrain.trainer.launch.start import launched_context, make_context
from shardtrain.trainer.parallel.fsdp_wrap import shard_group_size
from shardtrain.trainer.resolved import Components
from shardtrain.trainer.run_facts import run_facts

SLURM_STEP = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_NODEID": "1",
              "SLURM_LOCALID": "0", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_CPUS_PER_TASK": "16"}
TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}


def _hybrid_shards(ctx) -> int:
    cfg = parse_train_args(["data-bin", "--ddp-backend", "fully_sharded", "--fsdp-sharding-strategy", "hybrid_shard",
                            "--cpu"])
    return run_facts(cfg, Components.of(cfg), ctx.world_size, ctx.ranks_per_node).shards


def test_torchrun_inside_slurm_counts_torchrun_s_local_ranks(monkeypatch):
    env = {**SLURM_STEP, **TORCHRUN}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    launched = rendezvous.from_environment(env)
    ctx = launched_context(launched, use_cuda=False, backend="gloo")
    assert (ctx.rank, ctx.world_size, ctx.ranks_per_node) == (5, 8, 4)
    assert _hybrid_shards(ctx) == 4  # the facts: a node's 4 ranks, not SLURM's 1 task a node
    assert shard_group_size(ctx.world_size, None, ctx.ranks_per_node) == 4  # the mesh: the same 4
    assert threads.plan_threads(0, 16, env, launched.launcher).threads == 4  # 16 cores / 4 local ranks


def test_srun_alone_counts_slurm_s_tasks_a_node(monkeypatch):
    env = {**SLURM_STEP, "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_LOCALID": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    launched = rendezvous.from_environment(env, hostnames=lambda nodes: ["node1", "node2"])
    ctx = launched_context(launched, use_cuda=False, backend="gloo")
    assert (ctx.world_size, ctx.ranks_per_node) == (8, 4)
    assert _hybrid_shards(ctx) == 4 and shard_group_size(ctx.world_size, None, ctx.ranks_per_node) == 4


def test_spawned_ranks_are_all_on_this_node():
    assert make_context(0, 0, 6, use_cuda=False, backend="gloo").ranks_per_node == 6


def test_only_the_launch_reads_the_launchers_counts():
    """One rule: no other module reads torchrun's or SLURM's count of a node's ranks from the environment."""
    root = pathlib.Path(__file__).resolve().parents[3] / "shardtrain"
    readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if any(name in p.read_text() for name in ('"LOCAL_WORLD_SIZE"', '"SLURM_NTASKS_PER_NODE"')))
    assert readers == ["trainer/launch/threads.py"]
