"""Host memory under a container's cgroup limit (issue 28, item 4): MemAvailable is the machine's, so a
job in a container sized the headline GPU scenario, the pre-launch check and shard-plan's default
--host-memory by memory its cgroup would never give it. Each case is a fake /proc and /sys tree with
numbers written down."""
import types

import pytest

from shardtrain.core.errors import ConfigError
from shardtrain.trainer.memory import fit as memory_fit
from shardtrain.trainer.memory.host_memory import host_memory
from shardtrain.trainer.memory.fit import check_fits, host_available_bytes
from shardtrain.trainer.memory.rank_memory import RankMemory

GIB = 2 ** 30
V1_UNLIMITED = 9223372036854771712  # what cgroup v1 reads without a limit (on 4 KiB pages)


def tree(root, meminfo_gib=16, cgroup=None, files=None):
    """/proc/meminfo with MemAvailable ``meminfo_gib`` GiB, /proc/self/cgroup ``cgroup`` (lines), and
    ``files`` ({path under /sys/fs/cgroup: text})."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(f"MemTotal: {64 * 2 ** 20} kB\nMemAvailable: {meminfo_gib * 2 ** 20} kB\n")
    if cgroup is not None:
        (root / "proc/self/cgroup").write_text("".join(line + "\n" for line in cgroup))
    for path, text in (files or {}).items():
        f = root / "sys/fs/cgroup" / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text + "\n")
    return str(root)


def test_v2_limit_binds_less_its_reclaimable_cache(tmp_path):
    root = tree(tmp_path, cgroup=["0::/job/step"],
                files={"job/step/memory.max": str(8 * GIB), "job/step/memory.current": str(3 * GIB),
                       "job/step/memory.stat": f"anon {2 * GIB}\nfile {GIB}\ninactive_file {GIB}"})
    got = host_memory(root)
    assert got.available == 6 * GIB  # 8 GiB limit - (3 GiB used - 1 GiB of cache the kernel drops first)
    assert "memory.max 8.0 GiB" in got.source and "job/step" in got.source and "MemAvailable 16.0" in got.source
    assert host_available_bytes(root) == 6 * GIB


def test_v2_max_is_no_limit(tmp_path):
    root = tree(tmp_path, cgroup=["0::/job"], files={"job/memory.max": "max", "job/memory.current": str(GIB)})
    assert host_memory(root).available == 16 * GIB and host_memory(root).source == "MemAvailable"


def test_v1_limit_binds(tmp_path):
    cgroup = ["12:pids:/docker/abc", "4:memory:/docker/abc", "3:cpu,cpuacct:/docker/abc", "0::/docker/abc"]
    root = tree(tmp_path, cgroup=cgroup, files={"memory/docker/abc/memory.limit_in_bytes": str(4 * GIB),
                                                "memory/docker/abc/memory.usage_in_bytes": str(GIB)})
    got = host_memory(root)
    assert got.available == 3 * GIB and "memory.limit_in_bytes 4.0 GiB" in got.source


def test_v1_unlimited_is_no_limit(tmp_path):
    """This machine's own case (v1, 'unlimited' at every level of /process_api/<id>)."""
    root = tree(tmp_path, cgroup=["4:memory:/process_api/eb9e"],
                files={"memory/process_api/eb9e/memory.limit_in_bytes": str(V1_UNLIMITED),
                       "memory/process_api/eb9e/memory.usage_in_bytes": str(260 * 2 ** 20),
                       "memory/memory.limit_in_bytes": str(V1_UNLIMITED),
                       "memory/memory.usage_in_bytes": str(3 * GIB)})
    assert host_memory(root).available == 16 * GIB


def test_a_parents_limit_binds_its_children(tmp_path):
    """A Kubernetes pod's limit over a container without its own."""
    root = tree(tmp_path, cgroup=["0::/kubepods/pod1/ctr"],
                files={"kubepods/pod1/ctr/memory.max": "max", "kubepods/pod1/ctr/memory.current": str(GIB),
                       "kubepods/pod1/memory.max": str(2 * GIB), "kubepods/pod1/memory.current": str(GIB // 2),
                       "kubepods/memory.max": str(100 * GIB), "kubepods/memory.current": str(50 * GIB)})
    assert host_memory(root).available == 3 * GIB // 2  # the pod's 2 GiB - 0.5 GiB


def test_a_container_that_mounts_its_cgroup_as_the_root(tmp_path):
    """/proc/self/cgroup names the host's path, which does not exist inside: the limit is at the root."""
    root = tree(tmp_path, meminfo_gib=100, cgroup=["0::/system.slice/docker-abc.scope"],
                files={"memory.max": str(10 * GIB), "memory.current": str(4 * GIB)})
    assert host_memory(root).available == 6 * GIB


@pytest.mark.parametrize("cgroup", [None, ["0::/"], ["4:memory:/x"]])
def test_no_cgroup_files_leave_mem_available(tmp_path, cgroup):
    assert host_memory(tree(tmp_path, meminfo_gib=5, cgroup=cgroup)).available == 5 * GIB


def test_mem_available_binds_when_it_is_lower(tmp_path):
    root = tree(tmp_path, meminfo_gib=2, cgroup=["0::/job"],
                files={"job/memory.max": str(8 * GIB), "job/memory.current": str(GIB)})
    assert host_memory(root).available == 2 * GIB and host_memory(root).source == "MemAvailable"


def test_the_refusal_names_the_cgroup_limit_when_it_binds(tmp_path, monkeypatch):
    """check_fits measures the host itself: 10 GiB of state fits MemAvailable's 16 GiB but not the 6 GiB
    the cgroup leaves."""
    root = tree(tmp_path, cgroup=["0::/job"],
                files={"job/memory.max": str(8 * GIB), "job/memory.current": str(2 * GIB)})
    monkeypatch.setattr(memory_fit, "host_memory", lambda *args: host_memory(root))
    est = RankMemory(params=4 * GIB, grads=2 * GIB, optimizer=4 * GIB, master=0, buffers=0, activations=0,
                     grads_at_peak=2 * GIB)
    with pytest.raises(ConfigError, match=r"host memory available \(the cgroup memory limit: memory.max 8.0 GiB "
                                          r"in .*job, 2.0 GiB of it in use; MemAvailable 16.0 GiB\) is 6.0 GiB"):
        check_fits(est, 1)
    with pytest.raises(ConfigError, match=r"host memory available \(MemAvailable\) is 9.0 GiB"):
        check_fits(est, 1, available={"host": 9 * GIB})


def test_shard_plan_defaults_to_the_cgroup_limited_host_memory(tmp_path, monkeypatch):
    from shardtrain.plan import planner
    root = tree(tmp_path, cgroup=["0::/job"], files={"job/memory.max": str(8 * GIB), "job/memory.current": str(GIB)})
    monkeypatch.setattr(memory_fit, "host_memory", lambda *args: host_memory(root))
    monkeypatch.setattr(planner, "_matmul_speeds", lambda *args: {})
    monkeypatch.setattr(planner, "_copy_gbps", lambda threads: 1.0)
    cfg = types.SimpleNamespace(common=types.SimpleNamespace(cpu=True, threads=1),
                                distributed=types.SimpleNamespace(distributed_world_size=1))
    machine = planner.machine_for(cfg, None, None, None, None, None, None)
    assert machine.host_bytes == 7 * GIB
    assert planner.machine_for(cfg, None, 3.0, None, None, None, None).host_bytes == 3 * GIB  # --host-memory 3
