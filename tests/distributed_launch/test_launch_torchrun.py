"""call_main under torchrun: every rank joins torchrun's group (env://) and runs main once, in place."""
import json
import os
import subprocess
import sys

import launch_mains

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def test_torchrun_ranks_join_one_group_of_two(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               launch_mains.__file__, str(tmp_path)]
    done = subprocess.run(command, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

    pids = set()
    for rank in (0, 1):
        with open(tmp_path / f"rank{rank}.json") as f:
            seen = json.load(f)
        with open(tmp_path / f"after{rank}.json") as f:
            after = json.load(f)
        assert (seen["rank"], seen["local_rank"], seen["world_size"]) == (rank, rank, 2)
        assert (seen["dist_rank"], seen["dist_world_size"], seen["dist_backend"]) == (rank, 2, "gloo")
        assert seen["rank_sum"] == 1.0  # both ranks were in the same group
        # main ran in the process torchrun started, once; the group is gone afterwards
        assert after == {"result": {"from_rank": rank, "value": 0.5 + rank}, "group_initialized_after": False}
        pids.add(seen["pid"])
    assert len(pids) == 2
