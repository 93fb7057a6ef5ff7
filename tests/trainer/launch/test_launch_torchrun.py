"""call_main under torchrun: every rank joins torchrun's group (env://) and runs main once, in place."""
import json
import os
import subprocess
import sys

import pytest

import launch_mains

pytestmark = pytest.mark.slow  # every test here starts a process, a multi-rank group or a training run

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def torchrun_two_ranks(tmp_path, *flags) -> str:
    """launch_mains.py on 2 local CPU ranks under torchrun; returns its output."""
    tmp_path.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               launch_mains.__file__, str(tmp_path), *flags]
    done = subprocess.run(command, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def threads_seen(tmp_path):
    return [json.loads((tmp_path / f"rank{rank}.json").read_text())["threads"] for rank in (0, 1)]


@pytest.fixture(scope="module")
def default_launch(tmp_path_factory):
    """One torchrun launch without flags, for both tests: (its directory, its output)."""
    directory = tmp_path_factory.mktemp("torchrun") / "default"
    return directory, torchrun_two_ranks(directory)


def test_torchrun_ranks_join_one_group_of_two(default_launch):
    directory, _ = default_launch

    pids = set()
    for rank in (0, 1):
        with open(directory / f"rank{rank}.json") as f:
            seen = json.load(f)
        with open(directory / f"after{rank}.json") as f:
            after = json.load(f)
        assert (seen["rank"], seen["local_rank"], seen["world_size"]) == (rank, rank, 2)
        assert (seen["dist_rank"], seen["dist_world_size"], seen["dist_backend"]) == (rank, 2, "gloo")
        assert seen["rank_sum"] == 1.0  # both ranks were in the same group
        # main ran in the process torchrun started, once; the group is gone afterwards
        assert after == {"result": {"from_rank": rank, "value": 0.5 + rank}, "group_initialized_after": False}
        pids.add(seen["pid"])
    assert len(pids) == 2


@pytest.mark.flag_effect("--threads")
def test_torchrun_ranks_share_the_cores_unless_threads_is_given(default_launch, tmp_path):
    # torchrun sets OMP_NUM_THREADS=1 for 2 local ranks (its warning is in the output); each
    # rank must still get its share of the cores: the --cpu-offload optimizer runs on them.
    cores = len(os.sched_getaffinity(0))
    directory, output = default_launch
    assert "Setting OMP_NUM_THREADS environment variable" in output
    share = max(1, cores // 2)
    assert threads_seen(directory) == [share, share]
    assert (f"rank 0: {share} thread{'s' if share > 1 else ''} ({cores} usable cores / 2 local ranks; "
            "torchrun's default OMP_NUM_THREADS=1 ignored; --threads to override)") in output

    output = torchrun_two_ranks(tmp_path / "override", "--threads", "3")
    assert threads_seen(tmp_path / "override") == [3, 3]
    assert "rank 0: 3 threads (--threads 3)" in output
