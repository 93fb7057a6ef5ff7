"""The threads-per-rank policy as a table (no processes); under real torchrun in test_launch_torchrun.py."""
import pytest

from shardtrain.trainer.launch.threads import plan_threads

TORCHRUN_2 = {"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}  # what torchrun gives 2 local ranks by default

CASES = [
    # (requested --threads, usable cores, environment, launcher, spawned ranks) -> threads
    ((0, 16, {}, None, 1), 16),  # one process: every core
    ((0, 16, {}, None, 2), 8),  # shard-train's spawn, CPU or CUDA alike
    ((0, 3, {}, None, 4), 1),  # more ranks than cores: at least 1
    ((0, 16, TORCHRUN_2, "torchrun", 1), 8),  # torchrun's default 1 is not the user's choice
    ((0, 16, {"LOCAL_WORLD_SIZE": "4"}, "torchrun", 1), 4),
    ((0, 16, {"LOCAL_WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"}, "torchrun", 1), 1),  # torchrun sets none for 1
    ((0, 16, {"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "3"}, "torchrun", 1), 3),  # the user's own value
    ((0, 16, {"OMP_NUM_THREADS": "1"}, None, 2), 1),  # set by the user before shard-train's spawn
    ((0, 16, {"OMP_NUM_THREADS": "4,2"}, None, 1), 4),  # OpenMP's nested form: the outer level
    ((0, 16, {"OMP_NUM_THREADS": "lots"}, None, 2), 8),  # not a number: the policy
    ((0, 16, {"SLURM_NTASKS_PER_NODE": "4", "SLURM_NTASKS": "8"}, "slurm", 1), 4),
    ((0, 16, {"SLURM_STEP_TASKS_PER_NODE": "2(x2),4", "SLURM_NODEID": "2", "SLURM_NTASKS": "8"}, "slurm", 1), 4),
    ((0, 16, {"SLURM_STEP_TASKS_PER_NODE": "2(x2),4", "SLURM_NODEID": "1", "SLURM_NTASKS": "8"}, "slurm", 1), 8),
    ((0, 16, {"SLURM_NTASKS": "2"}, "slurm", 1), 8),  # no per-node count: assume all tasks are here
    ((0, 8, {"SLURM_NTASKS_PER_NODE": "2", "SLURM_CPUS_PER_TASK": "8"}, "slurm", 1), 8),  # bound to its 8
    ((0, 16, {"SLURM_NTASKS_PER_NODE": "2", "SLURM_CPUS_PER_TASK": "32"}, "slurm", 1), 16),  # capped
    ((3, 16, TORCHRUN_2, "torchrun", 1), 3),  # --threads wins over everything
    ((5, 2, {"OMP_NUM_THREADS": "4"}, None, 2), 5),
]


@pytest.mark.parametrize("args,threads", CASES)
def test_threads_per_rank(args, threads):
    assert plan_threads(*args).threads == threads


def test_the_reason_names_the_division_and_the_override():
    reason = plan_threads(0, 16, TORCHRUN_2, "torchrun").reason
    assert reason == ("16 usable cores / 2 local ranks; torchrun's default OMP_NUM_THREADS=1 ignored; "
                      "--threads to override")
    assert plan_threads(3, 16, {}, None).reason == "--threads 3"
    assert "OMP_NUM_THREADS=4" in plan_threads(0, 16, {"OMP_NUM_THREADS": "4"}, None).reason
